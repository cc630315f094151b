"""Issue 44: the plan and the trainers read the same value for gradient checkpointing, the library's own default
where the recipe leaves it unset (TRL's GRPOConfig and SFTConfig default it to True; a plan that took an unset
key for False planned `recipes/demo/rl.yaml` without checkpointing while TRL trained it with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maps_train.library_options import GRPOOptions, SFTOptions
from maps_train.plan.stages import make_plan
from maps_train.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
# unset (the library's default), and each value stated
SETTINGS = {"unset": None, "on": "true", "off": "false"}


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name their accelerate configs and data relative to the repository


def _overrides(section: str, setting: str | None) -> list[str]:
    return [] if setting is None else [f"{section}.gradient_checkpointing={setting}"]


def _planned(path: str, overrides: list[str], process: str) -> str:
    """'on' or 'off': what the plan's one row whose process names `process` says of checkpointing."""
    (row,) = [row for row in make_plan(path, overrides).rows if process in row.process]
    (said,) = [word for word in ("checkpointing on", "checkpointing off") if word in row.note]
    return said.removeprefix("checkpointing ")


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("path", ["recipes/demo/rl.yaml", "recipes/distill/qwen3-4b.yaml"])
def test_the_rl_row_plans_checkpointing_as_trls_grpo_config_resolves_it(path, setting, tmp_path):
    from trl import GRPOConfig

    overrides = _overrides("rl.grpo", SETTINGS[setting])
    recipe = load_recipe(path, overrides)
    typed = GRPOOptions.of(recipe.rl.grpo).gradient_checkpointing
    trl_value = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=recipe.rl.num_generations,
                           **recipe.rl.grpo).gradient_checkpointing
    assert typed is trl_value
    assert _planned(path, overrides, "GRPO rank ") == ("on" if trl_value else "off")
    if setting != "unset":
        assert trl_value is (setting == "on")


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("path", ["recipes/demo/demo.yaml", "recipes/distill/qwen3-4b.yaml"])
def test_the_train_row_plans_checkpointing_as_trls_sft_config_resolves_it(path, setting, tmp_path):
    from trl import SFTConfig

    overrides = _overrides("train.sft", SETTINGS[setting])
    recipe = load_recipe(path, overrides)
    typed = SFTOptions.of(recipe.train.sft).gradient_checkpointing
    trl_value = SFTConfig(output_dir=str(tmp_path), use_cpu=True, **recipe.train.sft).gradient_checkpointing
    assert typed is trl_value
    assert _planned(path, overrides, " x rank ") == ("on" if trl_value else "off")
    if setting != "unset":
        assert trl_value is (setting == "on")
