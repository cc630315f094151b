"""The package's layering, as docs/architecture.md writes it down: no module imports a module of its own or a
higher layer from another package, a package's commands (`cli.py`) included. Checked twice: statically over every
import statement (lazy ones inside functions included), and by importing each package in a fresh interpreter and
listing what it loaded."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "maps_train"


def layers() -> dict[str, int]:
    """Top-level module or package of maps_train -> its layer, read from the ```layers block of the doc."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", doc, re.DOTALL)
    assert block, "docs/architecture.md has no ```layers block"
    ranks = {}
    for line in block.group(1).splitlines():
        rank, _, names = line.partition(":")
        for name in names.split():
            ranks[name] = int(rank)
    return ranks


def top_level(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "maps_train" and len(parts) > 1 else None


# Upward imports still there, each by file and module (none: `score-traces` moved to evaluate/). Only removals may
# change this set; a new upward import fails the test.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def owner(path: Path) -> str:
    """The top-level module or package a file belongs to (a package's `cli.py` too: a stage command reaches its
    pre-flight, `plan.preflight` above every stage, through `preflight_hook`)."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "maps_train":
                found += [(node.lineno, f"maps_train.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if top_level(name)]


def test_every_module_has_a_layer():
    ranks = layers()
    owners = {owner(path) for path in PACKAGE.rglob("*.py")} - {"__init__"}
    assert owners <= set(ranks), f"not in docs/architecture.md's layers: {sorted(owners - set(ranks))}"
    assert set(ranks) <= owners, f"layers name modules that do not exist: {sorted(set(ranks) - owners)}"


def upward_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, module imported, why) for each import of a module of the importer's own or a higher layer."""
    ranks = layers()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = owner(path)
        for line, name in imports(path):
            target = top_level(name)
            if target != mine and target in ranks and mine in ranks and ranks[target] >= ranks[mine]:
                found.append((str(path.relative_to(REPO)), line, name,
                              f"{mine} (layer {ranks[mine]}) imports {name} (layer {ranks[target]})"))
    return found


def test_no_module_imports_its_own_or_a_higher_layer():
    found = upward_imports()
    wrong = [f"{file}:{line}: {why}" for file, line, name, why in found if (file, name) not in KNOWN_UPWARD]
    assert not wrong, "\n".join(wrong)
    assert {(file, name) for file, _, name, _ in found} == KNOWN_UPWARD  # one removed: take it off the list


def test_a_stage_command_reaches_its_preflight_through_the_hook():
    """Every stage command runs `plan.preflight` first, installed by the command line, without importing it."""
    from maps_train import cli, preflight_hook
    from maps_train.plan.preflight import preflight

    assert cli.app is not None and preflight_hook._installed == [preflight]


@pytest.mark.parametrize("name", sorted(layers()))
def test_importing_a_package_loads_nothing_above_it(name):
    ranks = layers()
    code = (f"import json, sys; import maps_train.{name}; "
            "print(json.dumps(sorted({m.split('.')[1] for m in sys.modules if m.startswith('maps_train.')})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1])) - {name}
    above = sorted(m for m in loaded if ranks.get(m, -1) >= ranks[name])
    assert not above, f"import maps_train.{name} loaded {above}"
