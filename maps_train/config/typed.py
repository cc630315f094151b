"""YAML onto dataclasses: every value checked against its field's annotation (`build`), then by the field's
validator (`metadata={"check": ...}`, see `maps_train.config.checks`, raising `FieldError`), and a dict checked
against a library's dataclass (`check_dataclass_kwargs`). A mismatch is one `ConfigError` line naming the file and
the dotted field.

The coercion is written here rather than left to pydantic: pydantic's lax mode turns `1` into `True` and `"3"`
into 3 (typos a recipe load refuses), its strict mode refuses YAML 1.1's `1e-4` (read as a string) for a float,
and both refuse a number for a str field (a model named `7`): the recipe's rules are one function (`_coerce`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from maps_train.config.sources import Source, Sources, source_of
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


def did_you_mean(name: str, names: Any) -> str:
    """` (did you mean 'x'?)` naming the nearest of `names` to `name`, or "" when none is near."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """`get_type_hints(cls)`, once per class: it evaluates every annotation, and a section of many entries (routes)
    builds the same dataclass once per entry."""
    return get_type_hints(cls)


def _coerce(value: Any, tp: Any, where: str, source: Source) -> Any:
    """Check `value` against annotation `tp`, converting where YAML is looser than Python (int -> float)."""
    origin = get_origin(tp)

    def fail() -> ConfigError:  # only on failure: the repr of a whole section at every level would be quadratic
        return ConfigError(f"{source_of(source, where)}: {where}: expected {_describe(tp)}, got {value!r}")

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
        raise fail()
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise fail()
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail()
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{where}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail()
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {
            _coerce(k, key_tp, f"{where}.{k}", source): _coerce(v, val_tp, f"{where}.{k}", source)
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise fail()
        return build(tp, value, where, source)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise fail()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail()
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise fail()
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise fail()


def coerce(value: Any, tp: Any, where: str) -> Any:
    """`value` checked against annotation `tp` (converted where YAML is looser, as in a recipe); else one
    ConfigError line `where: expected ..., got ...`."""
    try:
        return _coerce(value, tp, where, "")
    except ConfigError:
        raise ConfigError(f"{where}: expected {_describe(tp)}, got {value!r}") from None


def build(cls: type[T], raw: dict[str, Any], prefix: str, source: Source) -> T:
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in raw.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            # A section may know where a key it does not hold belongs (`unknown_key_hint`, e.g. moved keys).
            moved = getattr(cls, "unknown_key_hint", lambda _: None)(str(key))
            hint = f" (did you mean '{moved}'?)" if moved else did_you_mean(str(key), fields)
            raise ConfigError(f"{source_of(source, where)}: {where}: unknown key{hint}")
        kwargs[key] = _checked(fields[key], _coerce(value, hints[key], where, source), where, source)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(f"{source_of(source, where)}: {where}: required field is missing")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        at = source.latest(prefix) if isinstance(source, Sources) else source
        raise ConfigError(f"{at}: {prefix or cls.__name__}: {err}") from None


class FieldError(ConfigError):
    """Raised by a field's `check` (dataclass field metadata, see `_checked`): `key` is the path below the field
    ("" for the field itself), so the loader can name the file and the full dotted key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key, self.message = key, message


def _checked(field: dataclasses.Field, value: Any, where: str, source: Source) -> Any:
    """`value` passed through the field's `metadata["check"]` when it has one (e.g. a dict of a library's options
    checked against that library's dataclass); a `FieldError` becomes one line naming file and key."""
    check = field.metadata.get("check")
    if check is None:
        return value
    try:
        return check(value)
    except FieldError as err:
        at = f"{where}{'' if err.key.startswith('[') else '.'}{err.key}" if err.key else where
        raise ConfigError(f"{source_of(source, at)}: {at}: {err.message}") from None


def check_dataclass_kwargs(cls: type, raw: dict[str, Any], what: str) -> dict[str, Any]:
    """`raw` as keyword arguments of dataclass `cls` (a library's config, e.g. `trl.SFTConfig`): every key one of its
    fields (else `FieldError` with the nearest name), every value coerced to the field's annotation (YAML's "1e-4"
    string becomes a float). `what` names the class in messages."""
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    checked = {}
    for key, value in raw.items():
        if key not in names:
            raise FieldError(str(key), f"unknown {what} field{did_you_mean(str(key), names)}")
        try:
            checked[key] = _coerce(value, hints.get(key, Any), str(key), "")
        except ConfigError:
            raise FieldError(str(key), f"expected {_describe(hints[key])}, got {value!r}") from None
    return checked
