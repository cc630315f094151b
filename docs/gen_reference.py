"""The docs site's generated pages: the recipe reference and the CLI reference, written from the code.

An mkdocs hook (`hooks:` in mkdocs.yml): `on_files` adds `reference/recipe.md` (every section and field of
`maps_train.recipe.Recipe`: type, default, description, the stages that read it) and `reference/cli.md` (every
command of the `maps-train` typer app with its arguments and options) as generated pages, so the references are
rebuilt from the dataclasses and the typer app on every build and never drift from them. A field's description
is its `metadata={"help": ...}` (TRL's convention); where a field has none yet, the `#` comment written beside it.
`tests/test_docs_site.py` imports the two `*_markdown` functions directly.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any

RECIPE_PAGE = "reference/recipe.md"
CLI_PAGE = "reference/cli.md"

# Which commands read each recipe section; maps_train.config.explain.SECTION_STAGES wins where it exists.
FALLBACK_SECTION_STAGES = {
    "name": ["every stage (run and artifact names)"],
    "retrieval": ["index build", "retrieve serve", "traces", "run", "eval", "distill-on-policy", "rl", "plan"],
    "backend": ["traces", "run", "chat", "eval", "distill-on-policy", "rl", "plan"],
    "roles": ["traces", "run", "chat", "eval", "distill-on-policy", "rl", "plan"],
    "agent": ["traces", "run", "eval", "distill-on-policy", "rl"],
    "traces": ["traces", "sft-data"],
    "sft_data": ["sft-data", "train", "distill-on-policy"],
    "train": ["train", "serve", "eval", "rl", "plan"],
    "serve": ["serve", "load-adapters", "eval", "plan"],
    "onpolicy": ["distill-on-policy"],
    "rl": ["rl", "plan"],
    "wandb": ["traces", "train", "eval", "analyze", "rl", "study"],
    "hardware": ["plan", "the memory check of traces, train, serve, eval and rl"],
}
LIBRARY_SECTIONS = {
    "train.sft": "keyword arguments of TRL's `SFTConfig`",
    "train.lora": "keyword arguments of PEFT's `LoraConfig`",
    "rl.grpo": "keyword arguments of TRL's `GRPOConfig`",
}


def section_stages() -> dict[str, list[str]]:
    try:
        from maps_train.config.explain import SECTION_STAGES
    except ImportError:
        return FALLBACK_SECTION_STAGES
    return {**FALLBACK_SECTION_STAGES, **{key: list(value) for key, value in dict(SECTION_STAGES).items()}}


def explained() -> dict[str, Any]:
    """key -> `maps_train.config.explain`'s row (type, default, help), the rows `config show --explain` prints;
    empty where that module does not exist, and the dataclasses are read directly."""
    try:
        from maps_train.config.explain import explain_rows
    except ImportError:
        return {}
    from maps_train.recipe import Recipe

    return {row.key: row for row in explain_rows(Recipe)}


def comment_help(cls: type) -> dict[str, str]:
    """field -> the `#` comment beside it in the class body, or on the lines just above it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    helps: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"\s{4}(\w+): [^=]+=.*?(?:#\s*(.*))?$", line)
        if match:
            beside = match.group(2) or ""
            helps[match.group(1)] = " ".join(part for part in (*above, beside) if part)
        above = []
    return helps


def field_help(cls: type, item: dataclasses.Field) -> str:
    text = item.metadata.get("help") or comment_help(cls).get(item.name, "")
    return " ".join(str(text).split())


def type_text(item: dataclasses.Field) -> str:
    text = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", str(item.type))
    return text.replace("typing.", "")


def default_text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except TypeError:
        return repr(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_markdown(path: str, cls: type, instance: Any, stages: list[str], rows: dict[str, Any]) -> list[str]:
    doc = inspect.getdoc(cls) or ""
    own_doc = "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split("\n\n")[0].split())
    lines = [f"## `{path}`", ""]
    if own_doc:
        lines += [own_doc, ""]
    lines += [f"Class `{cls.__module__}.{cls.__qualname__}`. Read by: {', '.join(stages)}.", "",
              "| field | type | default | description |", "|---|---|---|---|"]
    nested = []
    for item in dataclasses.fields(cls):
        value = getattr(instance, item.name)
        key = f"{path}.{item.name}"
        if dataclasses.is_dataclass(value):
            nested.append((key, type(value), value))
            lines.append(f"| `{item.name}` | section | see [`{key}`](#{anchor(key)}) | {cell(field_help(cls, item))} |")
            continue
        row = rows.get(key)
        description = " ".join(row.help.split()) if row is not None and row.help else field_help(cls, item)
        kind = row.type if row is not None else type_text(item)
        if key in LIBRARY_SECTIONS:
            description = f"{LIBRARY_SECTIONS[key]}; the default shows maps-train's departures. {description}"
        elif row is not None:
            value = row.default
        lines.append(f"| `{item.name}` | `{cell(kind)}` | `{cell(default_text(value))}` | {cell(description)} |")
    lines.append("")
    for key, sub_cls, sub_instance in nested:
        lines += section_markdown(key, sub_cls, sub_instance, stages, rows)
    return lines


def anchor(key: str) -> str:
    """The heading id mkdocs' toc extension gives `## \\`key\\``: lower case, dots and spaces dropped."""
    return re.sub(r"[^\w\- ]", "", key).strip().lower().replace(" ", "-")


def recipe_sections() -> list[tuple[str, type, Any]]:
    """(path, class, default instance) of every top-level section; `roles` as one route."""
    from maps_train.recipe import Recipe, RoleRoute

    recipe = Recipe()
    sections = []
    for item in dataclasses.fields(Recipe):
        value = getattr(recipe, item.name)
        if dataclasses.is_dataclass(value):
            sections.append((item.name, type(value), value))
    sections.insert(2, ("roles.<role>", RoleRoute, RoleRoute()))
    return sections


def recipe_markdown() -> str:
    from maps_train.recipe import Recipe

    stages = section_stages()
    recipe = Recipe()
    lines = ["# Recipe reference", "",
             "Generated from the recipe's dataclasses (`maps_train/recipe.py`) on every docs build: each section, each",
             "field with its type, its default and its description (the field's `help` metadata), and the commands",
             "that read the section. A recipe is a YAML file whose keys are these fields; any field can be set on",
             "the command line as a dotted override (`agent.num_directions=4`), and `maps-train config show RECIPE`",
             "prints the resolved values. See [Recipes](recipes.md) for overlays, names and secrets.", "",
             "## Top level", "", "| field | type | default | description |", "|---|---|---|---|"]
    for item in dataclasses.fields(Recipe):
        value = getattr(recipe, item.name)
        if dataclasses.is_dataclass(value):
            target = f"see [`{item.name}`](#{anchor(item.name)})"
            lines.append(f"| `{item.name}` | section | {target} | {cell(field_help(Recipe, item))} |")
        elif item.name == "roles":
            target = "see [`roles.<role>`](#rolesrole)"
            lines.append(f"| `roles` | `{cell(type_text(item))}` | {target} | {cell(field_help(Recipe, item))} |")
        else:
            lines.append(f"| `{item.name}` | `{cell(type_text(item))}` | `{cell(default_text(value))}` | "
                         f"{cell(field_help(Recipe, item))} |")
    lines.append("")
    rows = explained()
    for path, cls, instance in recipe_sections():
        key = path.split(".")[0]
        lines += section_markdown(path, cls, instance, stages.get(key, ["-"]), rows)
    return "\n".join(lines)


def cli_commands() -> list[tuple[str, Any]]:
    """(full name, click command) of every leaf command of the `maps-train` app, in its help order."""
    import typer

    from maps_train.cli import app

    found = []

    def walk(command: Any, name: str) -> None:
        if hasattr(command, "commands"):
            for sub_name, sub in command.commands.items():
                walk(sub, f"{name} {sub_name}")
        else:
            found.append((name, command))

    walk(typer.main.get_command(app), "maps-train")
    return found


def cli_markdown() -> str:
    import typer

    from maps_train.cli import app

    root = typer.main.get_command(app)
    root_context = typer.Context(root, info_name="maps-train")
    lines = ["# CLI reference", "",
             "Generated from the `maps-train` typer app (`maps_train/cli.py` and each stage's `cli.py`) on every docs",
             "build: each command's help, its arguments and its options, as `maps-train COMMAND --help` prints them.",
             "", root.help or "", ""]
    group_help = {f"maps-train {name}": sub.help for name, sub in root.commands.items() if hasattr(sub, "commands")}
    shown_groups = set()
    for name, command in cli_commands():
        group = name.rsplit(" ", 1)[0]
        if group in group_help and group not in shown_groups:
            shown_groups.add(group)
            lines += [f"*`{group}`: {' '.join((group_help[group] or '').split())}*", ""]
        context = typer.Context(command, info_name=name.split(" ", 1)[1], parent=root_context)
        usage = " ".join([name, *command.collect_usage_pieces(context)])
        lines += [f"## `{name}`", "", "```", usage, "```", "", inspect.cleandoc(command.help or ""), ""]
        records = [(param, param.get_help_record(context)) for param in command.params]
        records = [(param, record) for param, record in records if record and not getattr(param, "hidden", False)]
        if records:
            lines += ["| argument or option | description |", "|---|---|"]
            for _param, (names, text) in records:
                lines.append(f"| `{cell(names)}` | {cell(' '.join(text.split()))} |")
            lines.append("")
    return "\n".join(lines)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated references to the site's files."""
    from mkdocs.structure.files import File

    for uri, text in ((RECIPE_PAGE, recipe_markdown()), (CLI_PAGE, cli_markdown())):
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=text))
    return files
