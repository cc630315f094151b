"""Where an RL run's files are: `<rl.output_dir>/adapters/<adapter>/` (the RL adapters, `rl_summary.json` written
last: finished; `adapters.json` beside them: the adapter set RL leaves, its RL'd adapters and the rest of the set it
started from), `<rl.output_dir>/_trainer/<role>/` (checkpoints, and `reward_settings.json`: what they were trained
under), `<rl.output_dir>/curves-<role>.png`; what a finished role's records say (a resume, or a finished role
skipped, under other reward settings is refused in one line: it would mix, or pass off, two objectives); which rank
this process is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maps_train.adapters import Adapter, AdapterSet
from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions
from maps_train.paths import write_text_atomic
from maps_train.recipe import TRAINER_SUBDIR, Recipe, adapter_of_role
from maps_train.rl.curves import plot_rl_curves, read_log_history
from maps_train.train.markers import RL_SUMMARY_FILE, RL_WRITER, claim

SUMMARY_FILE = RL_SUMMARY_FILE  # in each RL adapter's folder (written last: finished) and in rl.output_dir
ADAPTERS_SUBDIR = "adapters"
REWARD_SETTINGS_FILE = "reward_settings.json"  # in each role's trainer folder: what its checkpoints were trained on


def rl_adapter_dir(recipe: Recipe, role: str) -> Path:
    """Where RL writes the adapter of `role` (named as the recipe's `sft_data.adapter_roles` names it)."""
    return rl_adapters_root(recipe) / adapter_name(recipe, role)


def rl_adapters_root(recipe: Recipe) -> Path:
    """The adapter set RL writes: its adapters and their manifest (`adapters.json`)."""
    return Path(recipe.rl.output_dir) / ADAPTERS_SUBDIR


def adapter_name(recipe: Recipe, role: str) -> str:
    mapping = adapter_of_role(recipe)
    if role not in mapping:
        raise MapsTrainError(f"rl.roles: '{role}' is no role of sft_data.adapter_roles ({', '.join(sorted(mapping))})")
    return mapping[role]


def rl_trainer_dir(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / TRAINER_SUBDIR / role


def policy_start(init: str, source: AdapterSet, role: str) -> Path | None:
    """The adapter RL starts `role`'s policy from: its adapter in `source`, the set the environment serves too; None
    for a fresh LoRA: `rl.init: base`, or an adapter that learned nothing (no SFT rows, `train.unlearned`: the base
    model serves its roles, so RL starts there too)."""
    return source.adapter_of(role).folder if init == "distilled" else None


def with_rl_adapter(adapters: AdapterSet, recipe: Recipe, role: str, trained_roles: Sequence[str],
                    parent: str | None = None, sha256: str | None = None) -> AdapterSet:
    """The adapter set RL leaves: `adapters` with `role`'s adapter replaced by its RL adapter (serving the roles it
    trained), rooted at `<rl.output_dir>/adapters/`; the other adapters stay where they are."""
    rl_adapter = Adapter(adapter_name(recipe, role), rl_adapter_dir(recipe, role), adapters.adapter_of(role).roles,
                         tuple(trained_roles), "rl", parent, sha256)
    return adapters.with_adapter(rl_adapter, root=rl_adapters_root(recipe))


def curves_png(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / f"curves-{role}.png"


def curves_title(recipe: Recipe, role: str) -> str:
    return f"{recipe.name}: RL of the {adapter_name(recipe, role)} adapter"


def newest_trainer_state(recipe: Recipe, role: str) -> Path:
    """The Trainer's final trainer_state.json, else (an interrupted run) its newest complete checkpoint's."""
    from maps_train.train import sft

    final = rl_trainer_dir(recipe, role) / "trainer_state.json"
    checkpoint = sft.last_complete_checkpoint(rl_trainer_dir(recipe, role))
    return final if final.is_file() or not checkpoint else Path(checkpoint) / "trainer_state.json"


def plot_run_curves(recipe: Recipe) -> list[Path]:
    """Redraw each role's curves from its saved Trainer state (`maps-train rl --plot-only`), finished or not."""
    return [plot_rl_curves(read_log_history(newest_trainer_state(recipe, role)), curves_png(recipe, role),
                           curves_title(recipe, role)) for role in recipe.rl.roles]


def launched_world_size() -> int:
    """The ranks `accelerate launch` (torchrun) started, from WORLD_SIZE: known before anything loads."""
    import os

    return int(os.environ.get("WORLD_SIZE") or 1)


def is_main_rank() -> bool:
    """Rank 0 of the launch (RANK, from torchrun; no launcher: the only rank): it writes what is written once."""
    import os

    return int(os.environ.get("RANK") or 0) == 0


def claim_folder(folder: Path, role: str) -> None:
    """Create `folder` with RL's marker (`maps_train.train.markers`): RL writes only into a folder it made or an
    empty one, never into SFT's checkpoints (resuming from them would ship the SFT adapter as RL's)."""
    claim(folder, RL_WRITER, "rl", "set rl.output_dir to a folder of its own", role=role)

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


def drop_reference_copy(out_dir: Path) -> None:
    """PEFT saves every adapter of the model, TRL's frozen "ref" copy (the distilled adapter) in `ref/`: not part of
    the RL adapter, and a vLLM LoRA folder holds one adapter."""
    import shutil

    shutil.rmtree(out_dir / "ref", ignore_errors=True)
