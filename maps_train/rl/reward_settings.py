"""The reward settings a role is trained under, recorded beside its checkpoints and in its summary: a resume, or
a finished role skipped, under other settings is refused in one line (it would mix, or pass off, two objectives)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions
from maps_train.paths import write_text_atomic
from maps_train.recipe import Recipe
from maps_train.rl.layout import SUMMARY_FILE, rl_adapter_dir, rl_trainer_dir

REWARD_SETTINGS_FILE = "reward_settings.json"  # in each role's trainer folder: what its checkpoints were trained on


def reward_settings(recipe: Recipe, role: str) -> dict[str, Any]:
    """What decides `role`'s reward and its advantages: `rl.reward` with `rl.role_reward.<role>` over it, the GRPO
    options that shape the signal and how the branches are decoded (`rl.decoding`: whose sampling noise a branch's
    reward carries). A run resumed, or a finished role skipped, under other settings would mix or pass off two
    objectives as one."""
    grpo = GRPOOptions.of(recipe.rl.grpo)
    settings = {"reward": dataclasses.asdict(recipe.rl.reward_for(role)), "scale_rewards": grpo.scale_rewards,
                "mask_truncated_completions": grpo.mask_truncated_completions, "beta": grpo.beta,
                "num_generations": recipe.rl.num_generations, "temperature": recipe.rl.temperature,
                "decoding": recipe.rl.decoding}
    if recipe.rl.decisions != "sampled":  # recorded when set, so runs recorded before the option still resume
        settings["decisions"] = recipe.rl.decisions
    return settings


def _settings_differ(recorded: Any, current: dict[str, Any]) -> list[str]:
    if not isinstance(recorded, dict):
        return ["(none recorded)"]
    flat = lambda d: {f"{k}.{kk}" if isinstance(v, dict) else k: vv  # noqa: E731
                      for k, v in d.items() for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}
    old, new = flat(recorded), flat(current)
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def check_reward_settings(recipe: Recipe, role: str, recorded: Any, where: Path) -> None:
    """Refuse in one line to resume or skip a role trained under other reward settings."""
    changed = _settings_differ(recorded, reward_settings(recipe, role))
    if changed:
        raise MapsTrainError(f"{where}: rl {role} was trained under other reward settings ({', '.join(changed)} "
                             f"differ); use another rl.output_dir, or remove it to retrain")


def is_finished(recipe: Recipe, role: str) -> bool:
    """The role's adapter is finished (its summary written last); one trained under other reward settings is
    refused, not skipped."""
    path = rl_adapter_dir(recipe, role) / SUMMARY_FILE
    if not path.is_file():
        return False
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        recorded, steps = summary.get("reward_settings"), summary.get("global_step")
    except (OSError, ValueError, AttributeError):
        recorded, steps = None, None
    if isinstance(steps, int) and steps < 1:
        return False  # a summary of no GRPO step (written before runs that trained none were refused)
    check_reward_settings(recipe, role, recorded, path)
    return True


def record_reward_settings(recipe: Recipe, role: str) -> None:
    """Write the role's reward settings beside its checkpoints, or refuse a resume under other ones."""
    path = rl_trainer_dir(recipe, role) / REWARD_SETTINGS_FILE
    if path.is_file():
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        check_reward_settings(recipe, role, recorded, path)
        return
    write_text_atomic(path, json.dumps(reward_settings(recipe, role), indent=2) + "\n")
