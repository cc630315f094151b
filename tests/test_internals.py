"""Every access past TRL's and vLLM's public APIs lives in maps_train/train/internals.py, and the TRL versions it
was written against are the bounds pyproject.toml declares."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from maps_train.train import internals

REPO = Path(__file__).resolve().parent.parent
STDLIB_PRIVATE = {"os._Environ"}  # a type the standard library documents


def private_accesses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else type(node.value).__name__
            if owner not in ("self", "cls") and f"{owner}.{node.attr}" not in STDLIB_PRIVATE:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_no_module_but_internals_reaches_past_a_librarys_public_names():
    modules = [p for p in (REPO / "maps_train").rglob("*.py") if p.name != "internals.py"]
    assert [hit for path in modules for hit in private_accesses(path)] == []
    assert private_accesses(REPO / "maps_train" / "train" / "internals.py")  # the scan sees what is there


def test_pyproject_bounds_trl_to_the_versions_internals_was_written_against():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    trl = next(d for d in dependencies if re.match(r"trl\b", d))
    assert trl == f"trl>={internals.TESTED_TRL[0]},<{internals.TESTED_TRL[1]}"
    assert internals.check_trl_version() is True  # the installed TRL is inside them
