"""Names that become folder or run names (adapters, roles, systems, data sets, runs): plain, or one line."""

from __future__ import annotations

import re
from typing import Any

from maps_train.config.typed import FieldError
from maps_train.errors import ConfigError

MAX_NAME_LENGTH = 100
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def plain_name_problem(name: object) -> str | None:
    """Why `name` is not safe as one folder name (`'x' is not a plain name (...)`), or None when it is.

    Plain: ASCII letters, digits, `.`, `_`, `-`; not starting with `.` (no `..`, no hidden folders) or `-` (not
    read as an option); 1 to 100 characters. Names in recipes and suites (adapters, roles, systems, data sets, runs)
    become folders under an output folder, so `..`, `a/b`, an absolute path, an empty name or a NUL would put files
    somewhere else (or, for `train --overwrite`, remove them there) or nowhere.
    """
    if isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and _PLAIN_NAME.fullmatch(name):
        return None
    shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60]) + "..."
    rule = "letters, digits, '.', '_', '-'"
    if isinstance(name, str) and name[:1] in (".", "-"):
        rule += "; not starting with '.' or '-'"
    elif isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        rule += f"; at most {MAX_NAME_LENGTH} characters"
    return f"{shown} is not a plain name ({rule})"


def check_plain_name(name: object, where: str) -> str:
    """`name` if it is safe as one folder name (`plain_name_problem`), else `ConfigError` (`where: 'x' is not a
    plain name ...`)."""
    problem = plain_name_problem(name)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return str(name)  # already a str: plain_name_problem checked it


# Field checks (dataclass `metadata={"check": ...}`, see `_checked`): the loader names file and field.


def plain_name_field(name: str) -> str:
    """A field whose value becomes a folder or run name."""
    problem = plain_name_problem(name)
    if problem:
        raise FieldError("", problem)
    return name


def plain_name_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    """A mapping whose keys become folder or run names."""
    for key in mapping:
        plain_name_field(key)
    return mapping
