"""The docs site: it builds strictly from the tree, a broken link fails the build, and the generated references
list every recipe field and every CLI command (docs/gen_reference.py, run as an mkdocs hook)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The docs extra (`pip install -e ".[docs]"`) is part of `make install`: a missing mkdocs fails here, never skips.
import material  # noqa: F401
import mkdocs  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


def generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=600)


def copy_of_tree(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "mkdocs.yml"


def test_site_builds_strictly_with_the_generated_references(tmp_path):
    result = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    for page in ("index.html", "getting-started/index.html", "reference/recipe/index.html",
                 "reference/cli/index.html", "studies/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    recipe_page = (tmp_path / "site" / "reference/recipe/index.html").read_text()
    assert "search_question" in recipe_page and "rl.reward" in recipe_page


def test_a_broken_link_fails_the_build(tmp_path):
    config = copy_of_tree(tmp_path)
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    result = build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_a_broken_anchor_fails_the_build(tmp_path):
    config = copy_of_tree(tmp_path)
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [no such section](gpu-workflow.md#no-such-section).\n")
    result = build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stderr


def leaf_commands(command, ctx_factory, prefix: str) -> list[str]:
    """Every leaf command through click's public group API (list_commands/get_command), not the generator's."""
    ctx = ctx_factory(command)
    names = []
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if hasattr(sub, "list_commands"):
            names += leaf_commands(sub, ctx_factory, f"{prefix} {name}")
        else:
            names.append(f"{prefix} {name}")
    return names


def test_cli_reference_lists_every_command_with_its_help():
    import typer

    from maps_train.cli import app

    root = typer.main.get_command(app)
    expected = leaf_commands(root, lambda command: typer.Context(command), "maps-train")
    page = generator().cli_markdown()
    headings = re.findall(r"^## `(maps-train [^`]+)`$", page, flags=re.MULTILINE)
    assert sorted(headings) == sorted(expected)
    assert {"maps-train sft-data", "maps-train analyze credit", "maps-train config show"} <= set(headings)
    sft_data = root.commands["sft-data"]
    first_line = " ".join(sft_data.help.split())[:60]
    assert first_line in " ".join(page.split())
    assert "`--skip-bad-lines / --no-skip-bad-lines`" in page or "`--skip-bad-lines`" in page


def section_tables(page: str) -> dict[str, set[str]]:
    """heading key -> the field names in its table."""
    tables: dict[str, set[str]] = {}
    current = None
    for line in page.splitlines():
        heading = re.match(r"^## `([^`]+)`$", line)
        if heading:
            current = heading.group(1)
            tables[current] = set()
        elif current and (row := re.match(r"^\| `(\w+)` \|", line)):
            tables[current].add(row.group(1))
    return tables


def test_recipe_reference_lists_every_field_of_every_section():
    from maps_train.recipe import Recipe, RoleRoute

    tables = section_tables(generator().recipe_markdown())
    expected: dict[str, type] = {"roles.<role>": RoleRoute}

    def walk(path: str, cls: type, instance) -> None:
        expected[path] = cls
        for item in dataclasses.fields(cls):
            value = getattr(instance, item.name)
            if dataclasses.is_dataclass(value):
                walk(f"{path}.{item.name}", type(value), value)

    recipe = Recipe()
    for item in dataclasses.fields(Recipe):
        value = getattr(recipe, item.name)
        if dataclasses.is_dataclass(value):
            walk(item.name, type(value), value)
    assert set(expected) <= set(tables), set(expected) - set(tables)
    for path, cls in expected.items():
        assert tables[path] == {item.name for item in dataclasses.fields(cls)}, path


def test_recipe_reference_rows_carry_type_default_and_stages():
    page = generator().recipe_markdown()
    row = next(line for line in page.splitlines() if line.startswith("| `num_directions` |"))
    assert "`int`" in row and "`3`" in row
    agent = page.split("## `agent`", 1)[1].split("## `", 1)[0]
    assert "Read by:" in agent and "traces" in agent
