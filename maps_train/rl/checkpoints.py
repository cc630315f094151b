"""Resuming a role from its checkpoints, which the Trainer's own resume does not do right for a policy adapter
beside TRL's frozen "ref" copy."""

from __future__ import annotations

import json
from pathlib import Path

from maps_train.errors import MapsTrainError


def checkpoint_step(checkpoint: Path) -> int:
    """The global step a complete checkpoint was saved at (its trainer_state.json)."""
    return int(json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def state_of_checkpoint(trainer, checkpoint: Path):
    """What `trainer.train()` returns and leaves in `trainer.state`, for a run whose last step the checkpoint
    already holds (its policy adapter restored by `restore_policy_adapter`): the checkpoint's state, and the mean
    of its logged losses as the training loss."""
    from transformers import TrainerState
    from transformers.trainer_utils import TrainOutput

    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return TrainOutput(trainer.state.global_step, sum(losses) / len(losses) if losses else 0.0, {})


def restore_policy_adapter(trainer, checkpoint: Path) -> None:
    """Load the checkpoint's policy adapter ("default", saved at the checkpoint's root) into the model.

    The Trainer's own resume does not: PEFT saves a second adapter (TRL's "ref" copy) in a subfolder, and a
    checkpoint with adapter subfolders has only those loaded (transformers `_load_from_checkpoint`), so the policy
    would silently restart from the distilled weights. The "ref" copy it does load is the distilled adapter, as it
    must stay."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = checkpoint / "adapter_model.safetensors"
    if not weights.is_file():
        raise MapsTrainError(f"{checkpoint}: no adapter_model.safetensors to resume the policy from")
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = set_peft_model_state_dict(model, load_file(str(weights)), adapter_name="default")
    missing = [key for key in result.missing_keys if ".default." in key]
    if missing:
        raise MapsTrainError(f"{checkpoint}: the checkpoint lacks {len(missing)} policy weights (e.g. {missing[0]})")

