"""Defaults once: a shipped recipe states only its departures. A key a recipe file sets to the value it would have
without that key (the code's default, or its `base:` recipe's value) is a restatement, and this test names it, as
tests/test_library_options.py does for TRL's and PEFT's defaults in ours."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from maps_train.config.overlays import BASE_KEY, read_layered
from maps_train.config.yaml_io import read_yaml, to_dict
from maps_train.library_options import GRPO, LORA, SFT, library_defaults
from maps_train.recipe import Recipe, RoleRoute, load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml") if "accelerate" not in p.parts)
LIBRARY = {("train", "sft"): SFT, ("train", "lora"): LORA, ("rl", "grpo"): GRPO}


def _below(path: Path) -> Recipe:
    """What `path` builds on: its base recipe, or the code's defaults."""
    raw = read_yaml(path)
    return load_recipe(str(path.parent / raw[BASE_KEY])) if BASE_KEY in raw else Recipe()


def restated(raw: dict, below: object, where: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys of `raw` (one file's YAML over section `below`) whose value equals what `below` holds."""
    found = []
    hints = typing.get_type_hints(type(below))
    for key, value in raw.items():
        here = (*where, str(key))
        if key == BASE_KEY and not where:
            continue
        current = getattr(below, key)
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            found += restated(value, current, here)
        elif here == ("roles",):
            for role, route in value.items():
                found += restated(route, current.get(role, RoleRoute()), (*here, str(role)))
        elif here in LIBRARY:
            defaults = {**library_defaults(LIBRARY[here]), **current}
            found += [".".join((*here, k)) for k, v in value.items() if k in defaults and defaults[k] == v]
        elif to_dict(current) == value:
            found.append(".".join(here))
    return found


def test_the_finder_names_restated_keys_and_not_departures(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("agent:\n  max_rounds: 4\n")
    top = tmp_path / "top.yaml"
    top.write_text("base: base.yaml\nagent:\n  max_rounds: 10\n  top_k: 5\nroles:\n  r:\n    max_tokens: 256\n"
                   "train:\n  lora:\n    r: 16\n    lora_alpha: 8\n")
    # max_rounds 10 is the code's default but departs from the base's 4; top_k 5, a route's 256 and LoRA r 16 do not
    assert restated(read_yaml(top), _below(top)) == ["agent.top_k", "roles.r.max_tokens", "train.lora.r"]


# Recipes written while this rule landed, by another hand, to be trimmed by their owner: strict, so the marker
# must go as soon as the file complies.
PENDING: dict[str, str] = {}


def _case(path: Path):
    name = str(path.relative_to(REPO / "recipes"))
    marks = [pytest.mark.xfail(reason=PENDING[name], strict=True)] if name in PENDING else []
    return pytest.param(path, id=name, marks=marks)


@pytest.mark.parametrize("path", [_case(p) for p in RECIPES])
def test_a_recipe_states_only_its_departures(path):
    read_layered(path)  # loads as a chain
    assert restated(read_yaml(path), _below(path)) == [], "equal to the code's default (or the base's value)"


def test_a_setting_nothing_reads_is_refused_naming_the_one_read(tmp_path):
    from maps_train.errors import ConfigError

    path = tmp_path / "recipe.yaml"
    path.write_text("retrieval:\n  kind: bm25\n  top_k: 3\n")
    with pytest.raises(ConfigError, match=rf"^{path}: retrieval.top_k: unknown key \(did you mean 'agent.top_k'\?\)$"):
        load_recipe(str(path))
