"""Recipes built on recipes, and dotted overrides: `load_config(Recipe, "recipes/x.yaml", ["agent.top_k=4"])`.

A recipe may build on another: a top-level `base: ../teacher/qwen3-32b.yaml` (relative to the file) loads that
recipe first and deep-merges the file over it (mappings key by key; lists, scalars and null replace), in chains of
at most 16 files; errors name the file a bad key is written in (`Sources`). An override has at most 16 dotted
levels."""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from maps_train.config.sources import Sources
from maps_train.config.typed import build
from maps_train.config.yaml_io import StrictLoader, read_yaml
from maps_train.errors import ConfigError

T = TypeVar("T")

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
        parsed = yaml.load(value, Loader=StrictLoader) if value != "" else ""  # noqa: S506
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




BASE_KEY = "base"  # top-level key naming the recipe an overlay builds on, relative to the overlay's folder


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
    return load_config_with_sources(cls, path, overrides)[0]


def load_config_with_sources(cls: type[T], path: str | Path | None = None,
                             overrides: typing.Sequence[str] = ()) -> tuple[T, Sources]:
    """`load_config`, with where each dotted key was written (`Sources`: `config show --explain` names it)."""
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
    built = build(cls, raw, "", sources)
    try:  # so a stage that checks a section later (library_options.check_library_sections) names the file
        vars(built)[SOURCES_ATTRIBUTE] = sources
    except TypeError:  # a class with slots: its later errors name the key only
        pass
    return built, sources


SOURCES_ATTRIBUTE = "_sources"


def sources_of(config: Any) -> Sources | None:
    """Where each key of `config` (built by `load_config`) was written; None for one built in code."""
    return getattr(config, SOURCES_ATTRIBUTE, None)
