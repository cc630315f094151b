"""Typed configuration: YAML recipes mapped one-to-one onto dataclasses, with dotted CLI overrides.

`load_config(Recipe, "recipes/x.yaml", ["agent.num_directions=4"])` returns a `Recipe` whose every field was
checked against its annotation. Any mismatch raises `ConfigError` with one line naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
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
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


def _set_dotted(raw: dict[str, Any], keys: list[str], value: Any) -> None:
    node = raw
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such recipe file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML ({getattr(err, 'problem', err)})") from None
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
