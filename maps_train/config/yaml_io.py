"""YAML read strictly and written plainly.

The file must be UTF-8 (a leading BOM is dropped), a mapping key may appear once (`file:line: duplicate key
'x'`; PyYAML would silently keep the last), nesting stops at 64 levels and integers at 100 digits, so a bad file
is one line naming its line, never a traceback. Input that would only be an accident or an attack is refused the
same way, in a few seconds at most: a file over 256 KiB, a mapping over 10,000 keys, an alias that refers to the
node holding it (a cycle) or aliases that expand past 100,000 nodes or 64 levels (the "billion laughs")."""

from __future__ import annotations

import codecs
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from maps_train.errors import ConfigError

MAX_YAML_DEPTH = 64  # recipes and suites nest a few levels; deeper input is an accident or an attack
MAX_YAML_INT_DIGITS = 100
MAX_YAML_BYTES = 256 << 10  # the largest recipe is about 4 KB; PyYAML reads about 100 KB/s
MAX_YAML_NODES = 100_000  # after aliases are expanded: what every later step (merge, checks, dumps) walks
MAX_YAML_KEYS = 10_000  # in one mapping; a recipe section has a few dozen


class StrictLoader(yaml.SafeLoader):
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


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


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
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506  (a SafeLoader subclass)
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
