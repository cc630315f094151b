"""Where an RL run's files are: `<rl.output_dir>/adapters/<adapter>/` (the RL adapters, `rl_summary.json` written
last: finished), `<rl.output_dir>/_trainer/<role>/` (checkpoints), `<rl.output_dir>/curves-<role>.png`; which
rank this process is."""

from __future__ import annotations

from pathlib import Path

from maps_train.recipe import TRAINER_SUBDIR, Recipe, adapter_of_role
from maps_train.rl.curves import plot_rl_curves, read_log_history
from maps_train.train.markers import RL_SUMMARY_FILE, RL_WRITER, claim

SUMMARY_FILE = RL_SUMMARY_FILE  # in each RL adapter's folder (written last: finished) and in rl.output_dir
ADAPTERS_SUBDIR = "adapters"


def adapter_of(recipe: Recipe, role: str) -> str:
    return adapter_of_role(recipe)[role]


def rl_adapter_dir(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / ADAPTERS_SUBDIR / adapter_of(recipe, role)


def rl_trainer_dir(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / TRAINER_SUBDIR / role


def source_adapter_dir(recipe: Recipe, role: str) -> Path:
    """The distilled adapter RL starts from (rl.init: distilled)."""
    return Path(recipe.rl.adapters_dir or recipe.train.output_dir) / adapter_of(recipe, role)


def distilled_source(recipe: Recipe, role: str) -> Path | None:
    """The distilled adapter RL starts `role` from; None for a fresh LoRA: `rl.init: base`, or a distilled adapter
    that learned nothing (no SFT rows, `train.unlearned`: the base model serves its roles, so RL starts there too)."""
    from maps_train.train.sft import learned_nothing

    if recipe.rl.init != "distilled":
        return None
    source = source_adapter_dir(recipe, role)
    return None if learned_nothing(source) else source


def curves_png(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / f"curves-{role}.png"


def curves_title(recipe: Recipe, role: str) -> str:
    return f"{recipe.name}: RL of the {adapter_of(recipe, role)} adapter"


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
