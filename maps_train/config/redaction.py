"""Secrets hidden from anything that writes a recipe or a message where others can read it (run trackers,
`maps-train config show`, errors, log lines)."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from maps_train.config.yaml_io import to_dict

REDACTED = "***"
_SECRET_NAMES = frozenset({"api_key", "apikey", "token", "secret", "password", "passwd", "authorization"})
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_password")


def is_secret_key(key: object) -> bool:
    """Whether a field named `key` holds a credential (case-insensitive; `-` counts as `_`, as in `X-Api-Key`; a
    command-line flag's leading dashes do not count, as in `--hf-token`)."""
    if not isinstance(key, str):
        return False
    name = key.lower().replace("-", "_").lstrip("_")
    return name in _SECRET_NAMES or name.endswith(_SECRET_SUFFIXES)


_OVERRIDE = re.compile(r"(?P<key>[\w.-]+)=(?P<value>.*)", re.DOTALL)
# A URL's user info, wherever a string holds a URL (an override, a flag's value): as in urllib.parse.urlsplit, the
# netloc ends at the first "/", "?" or "#" and the user info is the netloc up to its last "@".
_URL_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# A flag and its value inside one string: a shell-joined command (`--api-key sk-...`), an override that sets a list
# (`serve.extra_args=[--api-key, sk-...]`), one element (`--api-key=sk-...`).
_FLAG_AND_VALUE = re.compile(
    r"(?P<flag>(?<![\w-])--?[A-Za-z][\w-]*)(?P<separator>['\"]?[\s,=]+['\"]?)(?P<value>[^\s,'\"\]}]+)"
)


def _redact_override(text: str) -> str:
    """`backend.api_key=sk-...` -> `backend.api_key=***` (suites and launch commands carry dotted overrides), and
    so `--api-key=sk-...` -> `--api-key=***` (one element of a command line)."""
    match = _OVERRIDE.fullmatch(text)
    if match and match["value"] and is_secret_key(match["key"].rsplit(".", 1)[-1]):
        return f"{match['key']}={REDACTED}"
    return text


def _redact_flag_value(match: re.Match) -> str:
    """The value after a secret flag hidden; one that is itself a flag (a bare `--hf-token`) is no value."""
    if is_secret_key(match["flag"]) and not match["value"].startswith("-"):
        return match["flag"] + match["separator"] + REDACTED
    return match[0]


def _redact_text(text: str) -> str:
    """A string with its secrets hidden: a secret override's value, a secret flag's value, and the user info of
    every URL in it (`http://user:pass@host:8000/v1` -> `http://***@host:8000/v1`: scheme, host, port and path stay
    readable)."""
    text = _FLAG_AND_VALUE.sub(_redact_flag_value, _redact_override(text))
    return _URL_USER_INFO.sub(rf"\g<scheme>{REDACTED}@", text)


def _is_secret_flag(item: Any) -> bool:
    """`--api-key`, `--hf-token`: a command-line flag whose value, in the next element, is a credential."""
    return isinstance(item, str) and item.startswith("-") and "=" not in item and is_secret_key(item)


def _redact_list(items: list | tuple) -> list:
    """Each element redacted; in a command line (`serve.extra_args`, a launch command) the element after a secret
    flag is its value. A next element that is itself a flag is no value (vLLM's bare `--hf-token` means the cached
    token) and stays."""
    redacted = []
    for index, item in enumerate(items):
        is_flag_value = index > 0 and _is_secret_flag(items[index - 1])
        if is_flag_value and not _is_empty(item) and not (isinstance(item, str) and item.startswith("--")):
            redacted.append(REDACTED)
        else:
            redacted.append(redact_secrets(item))
    return redacted


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | dict) and not value)


def redact_secrets(obj: Any) -> Any:
    """A deep copy of `obj` (a dict/list tree, or a dataclass such as a `Recipe`) with every secret replaced by
    "***": each non-empty value under a secret-looking key (`is_secret_key`), the value of each dotted override
    that sets one (`backend.api_key=sk-...` in a suite's `overrides`), the value after each secret-looking flag of
    a command line (`[--api-key, sk-...]`, `--api-key=sk-...`) and the user info of each URL in a string.

    The one redaction of the package, for anything that leaves the process with a recipe or a command in it:
    run-tracker configs, printed or saved recipes and suites, printed commands. Empty values stay empty, so the
    reader still sees that no key was set.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = to_dict(obj)
    if isinstance(obj, dict):
        return {
            key: REDACTED if is_secret_key(key) and not _is_empty(value) else redact_secrets(value)
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return _redact_list(obj)
    if isinstance(obj, str):
        return _redact_text(obj)
    return copy.deepcopy(obj)


def redact_text(text: str) -> str:
    """One line (an error, a log message) with its secrets hidden as `redact_secrets` hides them in a string:
    URL user info (`http://user:pass@host` -> `http://***@host`), secret overrides and secret flags' values."""
    return _redact_text(text)


def install_log_redaction() -> None:
    """Every log record made from now on in this process carries its message redacted (`redact_text`): the URL of
    a server with a password in it, logged by the package or by a library (httpx logs each request's URL), never
    reaches a terminal or a log file. Installed once by the entry points."""
    import logging

    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a record whose arguments do not fit its format: logging reports it
            return record
        cleaned = _redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return record

    redacted_record.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacted_record)
