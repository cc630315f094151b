"""Typed configuration: YAML recipes mapped one-to-one onto dataclasses, with dotted CLI overrides.

`load_config(Recipe, "recipes/x.yaml", ["agent.num_directions=4"])` returns a `Recipe` whose every field was
checked against its annotation. Any mismatch raises `ConfigError` with one line naming the file and the field.

YAML is read strictly: the file must be UTF-8 (a leading BOM is dropped), a mapping key may appear once
(`file:line: duplicate key 'x'`; PyYAML would silently keep the last), nesting stops at 64 levels and integers at
100 digits, so a bad file is one line naming its line, never a traceback.

Also here: `check_plain_name` for names that become folder names, and `redact_secrets` for anything that writes a
recipe where others can read it (run trackers, `maps-train config show`).
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from maps_train.errors import ConfigError

T = TypeVar("T")


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str, source: str) -> Any:
    """Check `value` against annotation `tp`, converting where YAML is looser than Python (int -> float)."""
    origin = get_origin(tp)
    fail = ConfigError(f"{source}: {where}: expected {_describe(tp)}, got {value!r}")
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where, source)
            except ConfigError:
                continue
        raise fail
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise fail
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{where}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {
            _coerce(k, key_tp, f"{where}.{k}", source): _coerce(v, val_tp, f"{where}.{k}", source)
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise fail
        return _build(tp, value, where, source)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise fail
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise fail
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise fail


def _build(cls: type[T], raw: dict[str, Any], prefix: str, source: str) -> T:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in raw.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source}: {where}: unknown key{hint}")
        kwargs[key] = _coerce(value, hints[key], where, source)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(f"{source}: {where}: required field is missing")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {prefix or cls.__name__}: {err}") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """`agent.num_directions=4` -> (["agent", "num_directions"], 4); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected KEY=VALUE, e.g. agent.num_directions=4")
    key, _, value = text.partition("=")
    try:
        parsed = yaml.load(value, Loader=_StrictLoader) if value != "" else ""  # noqa: S506
    except (yaml.YAMLError, ValueError, OverflowError):
        parsed = value
    return key.strip().split("."), parsed


def _set_dotted(raw: dict[str, Any], keys: list[str], value: Any) -> None:
    node = raw
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


MAX_YAML_DEPTH = 64  # recipes and suites nest a few levels; deeper input is an accident or an attack
MAX_YAML_INT_DIGITS = 100


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys, deep nesting and huge integers with a marked error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # The composer recurses once per level: bound it before Python's recursion limit turns it into a traceback.
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _reject_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(char.isdigit() for char in str(node.value))
        if digits > MAX_YAML_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"integer with {digits} digits (limit {MAX_YAML_INT_DIGITS})", node.start_mark
            )
        return super().construct_yaml_int(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping key written twice; reported as `file:line: duplicate key 'x'`, not as a syntax error."""


def _reject_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    """Raise at the second occurrence of a key among the mapping's own keys.

    Runs before merge keys (`<<: *base`) are flattened in, so a key that overrides a merged one is allowed.
    """
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: PyYAML reports it when it builds the mapping
            continue
        if seen is not None:
            raise DuplicateKeyError(
                None, None, f"duplicate key {key!r} (first at line {seen})", key_node.start_mark
            )
        first_line[key] = key_node.start_mark.line + 1


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def decode_utf8(data: bytes, source: str | Path) -> str:
    """`data` as text: a leading UTF-8 BOM dropped, invalid UTF-8 a `ConfigError` naming `source:line`."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{source}:{line}: not valid UTF-8 (byte 0x{data[err.start]:02x})") from None


def _yaml_error(err: yaml.YAMLError, path: Path, text: str) -> ConfigError:
    """One line naming the file and, where PyYAML knows it, the line."""
    if isinstance(err, yaml.reader.ReaderError):  # a control character: PyYAML knows the offset, not the line
        line = text.count("\n", 0, err.position) + 1
        return ConfigError(f"{path}:{line}: invalid YAML ({_one_line(err.reason)}: {chr(err.character)!r})")
    mark = getattr(err, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = _one_line(getattr(err, "problem", None) or err)
    if isinstance(err, DuplicateKeyError):
        return ConfigError(f"{path}{line}: {problem}")
    return ConfigError(f"{path}{line}: invalid YAML ({problem})")


def parse_yaml(text: str, path: str | Path) -> Any:
    """Strictly parsed YAML (see the module docstring); every failure is a `ConfigError` naming `path`."""
    path = Path(path)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506  (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise _yaml_error(err, path, text) from None
    except (ValueError, OverflowError) as err:  # e.g. a timestamp like 2024-02-30
        raise ConfigError(f"{path}: invalid YAML ({_one_line(err)})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such recipe file")
    raw = parse_yaml(decode_utf8(path.read_bytes(), path), path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return raw


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Read `path` (YAML), apply dotted overrides, and build a checked instance of dataclass `cls`."""
    raw = read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    for text in overrides:
        keys, value = parse_override(text)
        # A field typed as a dataclass but null in YAML becomes an empty section when overridden into.
        _set_dotted(raw, keys, value)
    if overrides:
        source = f"{source} (with overrides)"
    return _build(cls, raw, "", source)


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain YAML-ready data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False, allow_unicode=True)


# --- secrets ------------------------------------------------------------------------------------------------------

REDACTED = "***"
_SECRET_NAMES = frozenset({"api_key", "apikey", "token", "secret", "password", "passwd", "authorization"})
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_password")


def is_secret_key(key: object) -> bool:
    """Whether a field named `key` holds a credential (case-insensitive; `-` counts as `_`, as in `X-Api-Key`)."""
    if not isinstance(key, str):
        return False
    name = key.lower().replace("-", "_")
    return name in _SECRET_NAMES or name.endswith(_SECRET_SUFFIXES)


_OVERRIDE = re.compile(r"(?P<key>[\w.-]+)=(?P<value>.*)", re.DOTALL)


def _redact_override(text: str) -> str:
    """`backend.api_key=sk-...` -> `backend.api_key=***`: suites and launch commands carry dotted overrides."""
    match = _OVERRIDE.fullmatch(text)
    if match and match["value"] and is_secret_key(match["key"].rsplit(".", 1)[-1]):
        return f"{match['key']}={REDACTED}"
    return text


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | dict) and not value)


def redact_secrets(obj: Any) -> Any:
    """A deep copy of `obj` (a dict/list tree, or a dataclass such as a `Recipe`) in which every non-empty value
    under a secret-looking key (`is_secret_key`) is replaced by "***", as is the value of every dotted override
    string that sets one (`backend.api_key=sk-...` in a suite's `overrides`).

    For anything that leaves the process with a recipe in it: run-tracker configs, printed or saved recipes.
    Empty values stay empty, so the reader still sees that no key was set.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = to_dict(obj)
    if isinstance(obj, dict):
        return {
            key: REDACTED if is_secret_key(key) and not _is_empty(value) else redact_secrets(value)
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact_secrets(value) for value in obj]
    if isinstance(obj, str):
        return _redact_override(obj)
    return copy.deepcopy(obj)


# --- names that become folder names -------------------------------------------------------------------------------

MAX_NAME_LENGTH = 100
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def check_plain_name(name: object, where: str) -> str:
    """`name` if it is safe as one folder name, else `ConfigError` (`where: 'x' is not a plain name ...`).

    Plain: ASCII letters, digits, `.`, `_`, `-`; not starting with `.` (no `..`, no hidden folders) or `-` (not
    read as an option); 1 to 100 characters. Suite, system and data set names become run folders under out_dir, so
    `..`, `a/b`, an empty name or a NUL would put results somewhere else or nowhere.
    """
    if isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and _PLAIN_NAME.fullmatch(name):
        return name
    shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60]) + "..."
    rule = "letters, digits, '.', '_', '-'"
    if isinstance(name, str) and name[:1] in (".", "-"):
        rule += "; not starting with '.' or '-'"
    elif isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        rule += f"; at most {MAX_NAME_LENGTH} characters"
    raise ConfigError(f"{where}: {shown} is not a plain name ({rule})")
