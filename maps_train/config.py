"""Typed configuration: YAML recipes mapped one-to-one onto dataclasses, with dotted CLI overrides.

`load_config(Recipe, "recipes/x.yaml", ["agent.num_directions=4"])` returns a `Recipe` whose every field was
checked against its annotation. Any mismatch raises `ConfigError` with one line naming the file and the field.

A recipe may build on another: a top-level `base: ../teacher/qwen3-32b.yaml` (relative to the file) loads that
recipe first and deep-merges the file over it (mappings key by key; lists, scalars and null replace), in chains;
errors name the file a bad key is written in (`Sources`).

YAML is read strictly: the file must be UTF-8 (a leading BOM is dropped), a mapping key may appear once
(`file:line: duplicate key 'x'`; PyYAML would silently keep the last), nesting stops at 64 levels and integers at
100 digits, so a bad file is one line naming its line, never a traceback. Input that would only be an accident or
an attack is refused the same way, in a few seconds at most: a file over 256 KiB, a mapping over 10,000 keys, an
alias that refers to the node holding it (a cycle) or aliases that expand past 100,000 nodes or 64 levels (the
"billion laughs"), a `base:` chain over 16 files, an override over 16 dotted levels.

Also here: `check_plain_name` for names that become folder names, and `redact_secrets` for anything that writes a
recipe where others can read it (run trackers, `maps-train config show`).
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import difflib
import functools
import os
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


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """`get_type_hints(cls)`, once per class: it evaluates every annotation, and a section of many entries (routes)
    builds the same dataclass once per entry."""
    return get_type_hints(cls)


def _coerce(value: Any, tp: Any, where: str, source: Source) -> Any:
    """Check `value` against annotation `tp`, converting where YAML is looser than Python (int -> float)."""
    origin = get_origin(tp)

    def fail() -> ConfigError:  # only on failure: the repr of a whole section at every level would be quadratic
        return ConfigError(f"{_source_of(source, where)}: {where}: expected {_describe(tp)}, got {value!r}")

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
        return _build(tp, value, where, source)
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


def _build(cls: type[T], raw: dict[str, Any], prefix: str, source: Source) -> T:
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in raw.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            # A section may know where a key it does not hold belongs (`unknown_key_hint`, e.g. moved keys).
            moved = getattr(cls, "unknown_key_hint", lambda _: None)(str(key))
            close = [moved] if moved else difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{_source_of(source, where)}: {where}: unknown key{hint}")
        kwargs[key] = _checked(fields[key], _coerce(value, hints[key], where, source), where, source)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(f"{_source_of(source, where)}: {where}: required field is missing")
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
        raise ConfigError(f"{_source_of(source, at)}: {at}: {err.message}") from None


def check_dataclass_kwargs(cls: type, raw: dict[str, Any], what: str) -> dict[str, Any]:
    """`raw` as keyword arguments of dataclass `cls` (a library's config, e.g. `trl.SFTConfig`): every key one of its
    fields (else `FieldError` with the nearest name), every value coerced to the field's annotation (YAML's "1e-4"
    string becomes a float). `what` names the class in messages."""
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    checked = {}
    for key, value in raw.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise FieldError(str(key), f"unknown {what} field{hint}")
        try:
            checked[key] = _coerce(value, hints.get(key, Any), str(key), "")
        except ConfigError:
            raise FieldError(str(key), f"expected {_describe(hints[key])}, got {value!r}") from None
    return checked


MAX_OVERRIDE_LEVELS = 16  # train.sft.gradient_checkpointing_kwargs.use_reentrant is 4; more is a typo or an attack


def _shown(text: str, limit: int = 60) -> str:
    """`text` cut for a one-line error: an override or a name can be megabytes long."""
    return text if len(text) <= limit else text[:limit] + "..."


def parse_override(text: str) -> tuple[list[str], Any]:
    """`agent.num_directions=4` -> (["agent", "num_directions"], 4); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{_shown(text)}': expected KEY=VALUE, e.g. agent.num_directions=4")
    key, _, value = text.partition("=")
    keys = key.strip().split(".")
    if len(keys) > MAX_OVERRIDE_LEVELS:  # each level is a nested mapping every later step walks recursively
        raise ConfigError(
            f"override '{_shown(key)}': {len(keys)} dotted levels (limit {MAX_OVERRIDE_LEVELS})"
        )
    try:
        parsed = yaml.load(value, Loader=_StrictLoader) if value != "" else ""  # noqa: S506
    except (yaml.YAMLError, ValueError, OverflowError):
        parsed = value
    return keys, parsed


def _set_dotted(raw: dict[str, Any], keys: list[str], value: Any) -> None:
    node = raw
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


MAX_YAML_DEPTH = 64  # recipes and suites nest a few levels; deeper input is an accident or an attack
MAX_YAML_INT_DIGITS = 100
MAX_YAML_BYTES = 256 << 10  # the largest recipe is about 4 KB; PyYAML reads about 100 KB/s
MAX_YAML_NODES = 100_000  # after aliases are expanded: what every later step (merge, checks, dumps) walks
MAX_YAML_KEYS = 10_000  # in one mapping; a recipe section has a few dozen


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys, deep nesting, huge integers, huge mappings and aliases that
    loop or expand too far, with a marked error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # id(node) -> (nodes, levels) of the node with its aliases expanded; ids stay valid while the tree lives
        self._extent: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        # The composer recurses once per level: bound it before Python's recursion limit turns it into a traceback.
        self._depth += 1
        try:
            event = self.peek_event()
            if self._depth > MAX_YAML_DEPTH:
                raise self._refusal(f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            if isinstance(parent, yaml.MappingNode) and len(parent.value) >= MAX_YAML_KEYS:  # stop early
                raise self._refusal(f"a mapping with more than {MAX_YAML_KEYS} keys", event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(event, yaml.AliasEvent):
            return self._aliased(node, event)
        return self._measured(node)

    @staticmethod
    def _refusal(problem: str, mark: Any) -> yaml.composer.ComposerError:
        return yaml.composer.ComposerError(None, None, problem, mark)

    def _aliased(self, node: yaml.Node, event: yaml.AliasEvent) -> yaml.Node:
        """An alias names a node composed earlier; one still being composed holds the alias itself: a cycle, which
        every recursive step after loading (merge, checks, dumps) would follow until Python's recursion limit."""
        if id(node) not in self._extent:
            raise self._refusal(f"alias *{event.anchor} refers to a node that contains it (a cycle)", event.start_mark)
        return node

    def _measured(self, node: yaml.Node) -> yaml.Node:
        """Record `node`'s size and depth with aliases expanded (its children were measured as they were composed),
        so a few lines of aliases that expand to billions of nodes (or past the depth limit) are refused in time
        linear in the text, before anything walks the expansion."""
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        extents = [self._extent[id(child)] for child in children]
        nodes = 1 + sum(count for count, _ in extents)
        levels = 1 + max((depth for _, depth in extents), default=0)
        if nodes > MAX_YAML_NODES:
            raise self._refusal(f"expands to more than {MAX_YAML_NODES} nodes through aliases", node.start_mark)
        if levels > MAX_YAML_DEPTH:
            raise self._refusal(f"nested deeper than {MAX_YAML_DEPTH} levels through aliases", node.start_mark)
        self._extent[id(node)] = (nodes, levels)
        return node

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
    with path.open("rb") as handle:
        data = handle.read(MAX_YAML_BYTES + 1)  # never more, whatever the file grows to while we read
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES} bytes, the limit of a recipe file")
    raw = parse_yaml(decode_utf8(data, path), path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return raw


# --- overlays: a recipe built on another (`base: ../teacher/qwen3-32b.yaml`) ------------------------------------

BASE_KEY = "base"  # top-level key naming the recipe an overlay builds on, relative to the overlay's folder


class Sources:
    """Which file each dotted key came from, so an error names the file the bad key is written in (an overlay or
    one of its bases), not only the file the user named."""

    def __init__(self, default: str):
        self.default = default  # for keys no file wrote (a missing required field): the file the user named
        self.origins: dict[str, str] = {}  # in the order written: see `latest`
        # key -> keys recorded below it, so replacing a section forgets its keys without scanning every key (which
        # made a file of many keys quadratic). May still name keys replaced since: those are popped harmlessly.
        self._below: dict[str, set[str]] = {}

    def at(self, where: str) -> str:
        key = where
        while key:
            if key in self.origins:
                return self.origins[key]
            key = _parent_key(key)
        return self.default

    def latest(self, where: str) -> str:
        """The file that last wrote `where` or anything below it: for an error about a whole section (a check across
        its fields), the layer that changed it last is the one to look at."""
        below = [k for k in self.origins if k == where or k.startswith((f"{where}.", f"{where}["))]
        return self.origins[below[-1]] if below and where else self.at(where)

    def record(self, where: str, value: Any, origin: str) -> None:
        """`where` (and everything below it) now comes from `origin`; what an earlier file put below it is gone."""
        for key in self._below.pop(where, ()):
            self.origins.pop(key, None)
        self.touch(where, origin)
        if isinstance(value, dict):
            for key, item in value.items():
                self.record(f"{where}.{key}", item, origin)

    def touch(self, where: str, origin: str) -> None:
        """`where` itself now comes from `origin` and is the latest key written (what is below it stays)."""
        self.origins.pop(where, None)
        self.origins[where] = origin
        parent = _parent_key(where)
        while parent:
            self._below.setdefault(parent, set()).add(where)
            parent = _parent_key(parent)


Source = str | Sources


def _source_of(source: Source, where: str) -> str:
    return source.at(where) if isinstance(source, Sources) else source


def _parent_key(key: str) -> str:
    """`a.b[2]` -> `a.b` -> `a` -> ``."""
    cut = key.rfind("[") if key.endswith("]") else key.rfind(".")
    return key[:cut] if cut > 0 else ""


def deep_merge(base: dict[str, Any], overlay: dict[str, Any], sources: Sources, origin: str, prefix: str = "") -> None:
    """Merge `overlay` into `base` in place: mappings key by key, anything else (lists, scalars, null) replaces."""
    for key, value in overlay.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value, sources, origin, where)
            sources.touch(where, origin)  # re-inserted last: see Sources.latest
        else:
            base[key] = value
            sources.record(where, value, origin)


def _base_path(path: Path, base: Any) -> Path:
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: {BASE_KEY}: expected the path of a recipe file (relative to this one), got {base!r}")
    base_path = Path(os.path.normpath(path.parent / base))  # named in errors: recipes/teacher/x.yaml, not a/../x.yaml
    if not base_path.is_file():
        raise ConfigError(f"{path}: {BASE_KEY}: {base_path}: no such recipe file")
    return base_path


MAX_BASE_CHAIN = 16  # files in one chain; a student on its teacher is 2


def _base_chain(path: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(file, its YAML without `base`) from `path` down to the recipe with no base, read in a loop (a long chain
    is one line, not a recursion); a cycle or a chain over MAX_BASE_CHAIN files is one line."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    resolved_chain: list[Path] = []
    while True:
        resolved = path.resolve()
        if resolved in resolved_chain:
            loop = " -> ".join(str(p) for p in (*resolved_chain, resolved))
            raise ConfigError(f"{path}: {BASE_KEY}: recipes that are each other's base ({loop})")
        raw = read_yaml(path)
        base = raw.pop(BASE_KEY, None)
        chain.append((path, raw))
        resolved_chain.append(resolved)
        if base is None:
            return chain
        if len(chain) == MAX_BASE_CHAIN:
            raise ConfigError(f"{path}: {BASE_KEY}: a chain of more than {MAX_BASE_CHAIN} recipes (from {chain[0][0]})")
        path = _base_path(path, base)


def read_layered(path: str | Path) -> tuple[dict[str, Any], Sources]:
    """A recipe file with its `base` chain resolved: the base's YAML first, deep-merged under the file's own.

    Returns the merged mapping (without `base` keys) and where each key came from. A cycle is one line.
    """
    chain = _base_chain(Path(path))
    bottom, merged = chain[-1]
    sources = Sources(str(bottom))
    for key, value in merged.items():
        sources.record(str(key), value, str(bottom))
    for layer, raw in reversed(chain[:-1]):
        sources.default = str(layer)
        deep_merge(merged, raw, sources, str(layer))
    return merged, sources


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Read `path` (YAML; with its `base` chain when `cls` has no field of that name), apply dotted overrides, and
    build a checked instance of dataclass `cls`."""
    layered = BASE_KEY not in {f.name for f in dataclasses.fields(cls)}
    if path is None:
        raw, sources = {}, Sources("<defaults>")
    elif layered:
        raw, sources = read_layered(path)
    else:
        raw, sources = read_yaml(path), Sources(str(path))
    overridden = f"{sources.default} (with overrides)"
    for text in overrides:
        keys, value = parse_override(text)
        # A field typed as a dataclass but null in YAML becomes an empty section when overridden into.
        _set_dotted(raw, keys, value)
        sources.record(".".join(keys), value, overridden)
    return _build(cls, raw, "", sources)


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


# --- names that become folder names -------------------------------------------------------------------------------

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
