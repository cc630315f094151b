"""What each recipe field means, where its value came from, and which stages read each section.

`explain_rows(Recipe)` lists every field of every section (a route's fields under `roles.<role>`) with its type,
default and description (the field's `metadata["help"]`); `explain_rows(recipe, sources)` adds the resolved value and
the file that set it (a recipe of the `base:` chain, "override" for a dotted override, "default" where no file did).
`SECTION_STAGES` says which commands read each section. `maps-train config show RECIPE --explain` prints these rows,
and the docs' recipe reference is generated from the same two names.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from maps_train.config.sources import Sources

# Section -> the commands (stages) that read it. `hardware` is read by every command that checks its memory plan.
SECTION_STAGES: dict[str, tuple[str, ...]] = {
    "name": ("every command: run and artifact names",),
    "retrieval": ("index build", "retrieve serve", "run", "traces", "eval", "distill-on-policy", "rl", "study", "plan"),
    "backend": ("run", "traces", "eval", "serve", "distill-on-policy", "rl", "plan"),
    "roles": ("run", "traces", "eval", "distill-on-policy", "rl", "plan"),
    "agent": ("run", "traces", "eval", "distill-on-policy", "rl", "study"),
    "traces": ("traces", "sft-data", "distill-on-policy", "rl", "study"),
    "sft_data": ("sft-data", "train", "distill-on-policy", "study"),
    "train": ("sft-data", "train", "serve", "eval", "rl", "distill-on-policy", "plan", "study"),
    "serve": ("serve", "eval", "rl", "distill-on-policy", "plan"),
    "onpolicy": ("distill-on-policy",),
    "rl": ("rl", "eval", "plan", "study"),
    "wandb": ("traces", "train", "eval", "rl", "distill-on-policy"),
    "hardware": ("plan", "every command's memory check (traces, train, serve, eval, rl)"),
}


@dataclass(frozen=True)
class ExplainRow:
    """One field: its dotted key, type, default, value (the default for a class), source and description."""

    key: str
    type: str
    default: Any
    value: Any
    source: str
    help: str


def type_name(tp: Any) -> str:
    """An annotation as a recipe writer reads it: `int or null`, `one of 'a', 'b'`, `list[str]`."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _default(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def _plain(value: Any) -> Any:
    from maps_train.config.yaml_io import to_dict

    return to_dict(value)


def _source(sources: Sources | None, key: str) -> str:
    if sources is None:
        return "default"
    origin = sources.origins.get(key)
    if origin is None:
        return "default"
    return "override" if origin.endswith("(with overrides)") else origin


def explain_rows(recipe_or_class: Any, sources: Sources | None = None, prefix: str = "") -> list[ExplainRow]:
    """A row per field of `recipe_or_class` (a section dataclass or an instance) and of the sections below it.

    A class gives its defaults as values (source "default"); an instance gives its values, each with the file that
    set it in `sources` (from `maps_train.config.overlays.read_recipe`). A dataclass-valued field becomes its own
    fields' rows; a mapping of dataclasses (the routes) one set of rows per entry, or `<role>` for a class."""
    cls = recipe_or_class if isinstance(recipe_or_class, type) else type(recipe_or_class)
    instance = None if isinstance(recipe_or_class, type) else recipe_or_class
    hints = typing.get_type_hints(cls)
    rows: list[ExplainRow] = []
    for item in dataclasses.fields(cls):
        key, tp = f"{prefix}{item.name}", hints[item.name]
        default = _default(item)
        value = default if instance is None else getattr(instance, item.name)
        if dataclasses.is_dataclass(tp):
            rows.extend(explain_rows(tp if instance is None else value, sources, f"{key}."))
            continue
        entry = _mapped_dataclass(tp)
        if entry is not None:
            names = ["<role>"] if instance is None else list(value)
            for name in names:
                below = entry if instance is None else value[name]
                rows.extend(explain_rows(below, sources, f"{key}.{name}."))
            continue
        rows.append(ExplainRow(key, type_name(tp), _plain(default), _plain(value), _source(sources, key),
                               str(item.metadata.get("help", ""))))
    return rows


def _mapped_dataclass(tp: Any) -> type | None:
    """The value class of `dict[str, SomeDataclass]`, else None."""
    if typing.get_origin(tp) is dict:
        args = typing.get_args(tp)
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):
            return args[1]
    return None


def redacted(rows: list[ExplainRow]) -> list[ExplainRow]:
    """The rows with every secret value (backend.api_key, a token under train.sft) as "***", as `config show`
    prints them (`maps_train.config.redaction`)."""
    from maps_train.config.redaction import is_secret_key, redact_secrets

    def hide(row: ExplainRow, value: Any) -> Any:
        if is_secret_key(row.key.rsplit(".", 1)[-1]) and value not in ("", None):
            return "***"
        return redact_secrets(value) if isinstance(value, dict | list) else value

    return [dataclasses.replace(row, value=hide(row, row.value), default=hide(row, row.default)) for row in rows]


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)


def format_rows(rows: list[ExplainRow], section: str | None = None) -> str:
    """The rows as text, a block per field (key, then type, default, value, source, description), grouped by
    section with the stages that read it; `section` keeps one section's rows."""
    lines: list[str] = []
    current = None
    for row in rows:
        top = row.key.split(".", 1)[0]
        if section is not None and top != section:
            continue
        if top != current:
            current = top
            lines.append(f"# {top}: read by {', '.join(SECTION_STAGES.get(top, ('?',)))}")
        lines.append(f"{row.key}  ({row.type})")
        lines.append(f"    value: {_shown(row.value)}   default: {_shown(row.default)}   from: {row.source}")
        lines.append(f"    {row.help}")
    return "\n".join(lines) + "\n"
