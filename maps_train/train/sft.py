"""From a recipe's `train` section to TRL/PEFT objects, and an adapter folder vLLM can serve.

`train.sft` and `train.lora` are handed to `trl.SFTConfig` and `peft.LoraConfig` as they are (the recipe loader has
already checked their keys against those classes); only what maps-train must decide is set here.

Kept apart from the entry point so tests and benchmarks build exactly the configs the launcher uses.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.platform import cpu_multiplies_bf16
from maps_train.tracking import artifact_name, wandb_environment
from maps_train.train.adapter_check import SUPPORTED_MODULES, TOKENIZER_FILES, config_problems

SUMMARY_FILE = "train_summary.json"  # written last: its presence marks a finished adapter
TRAINER_SUBDIR = "_trainer"  # checkpoints and trainer state, kept out of the adapter folders

logger = logging.getLogger(__name__)


@dataclass
class Precision:
    dtype: str  # the weights' dtype at load time
    bf16: bool  # mixed precision in the trainer


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def distributed_state():
    """accelerate's process state, initialised the way the trainer will initialise it.

    On a machine without CUDA the state must be asked for with `cpu=True`: only then do the ranks that
    `accelerate launch --multi_gpu` started join one gloo group (MULTI_CPU). Without it every rank quietly trains
    alone on the whole set (world size 1, each writing the same adapter).
    """
    from accelerate import PartialState

    return PartialState(cpu=on_cpu())


def choose_precision(train) -> Precision:
    """GPU: bf16 when `train.sft.bf16`. CPU: float32 weights; bf16 autocast only when `train.sft.bf16` asks and
    the CPU has bf16 instructions (`cpu_multiplies_bf16`), else float32 throughout (said once in the log)."""
    bf16 = bool(train.sft.get("bf16"))
    if on_cpu():
        if bf16 and not cpu_multiplies_bf16():
            logger.warning("train.sft.bf16: this CPU has no bf16 instructions (AVX512-BF16, AMX); training in float32")
            bf16 = False
        return Precision(dtype="float32" if train.dtype == "auto" else train.dtype, bf16=bf16)
    if train.dtype != "auto":
        return Precision(dtype=train.dtype, bf16=bf16)
    return Precision(dtype="bfloat16" if bf16 else "float32", bf16=bf16)


def adapter_output_dir(recipe, adapter: str) -> Path:
    return Path(recipe.train.output_dir) / adapter


def adapter_artifact(recipe, adapter: str) -> str:
    """The W&B artifact name of one trained adapter (`adapter-<recipe name>-<adapter>`)."""
    return artifact_name("adapter", f"{recipe.name}-{adapter}")


def adapter_artifacts(recipe) -> list[tuple[str, Path]]:
    """(artifact name, folder) of every adapter the recipe trains and serves: what an eval run of the distilled
    student links as its inputs (`tracker.use_artifact(name, "adapter", folder)`)."""
    from maps_train.recipe import adapter_names

    root = Path(recipe.serve.adapters_dir or recipe.train.output_dir)
    return [(adapter_artifact(recipe, name), root / name) for name in adapter_names(recipe)]


def trainer_dir(recipe, adapter: str) -> Path:
    return Path(recipe.train.output_dir) / TRAINER_SUBDIR / adapter


def is_trained(recipe, adapter: str) -> bool:
    return (adapter_output_dir(recipe, adapter) / SUMMARY_FILE).is_file()


def lora_target_modules(targets: Any) -> Any:
    """`all-linear` means every attention and MLP projection (PEFT's all-linear leaves lm_head out too, but may take
    other linear layers vLLM serves no LoRA on); anything else goes to PEFT as written (and is checked after)."""
    return list(SUPPORTED_MODULES) if targets == "all-linear" else targets


def build_lora_config(train):
    """peft.LoraConfig from `train.lora`, refused here when vLLM could not serve the adapter it would train (the rules
    `adapter_check` applies to saved adapters: rank, target modules, DoRA, modules_to_save, ...)."""
    from peft import LoraConfig

    options = {**train.lora, "target_modules": lora_target_modules(train.lora.get("target_modules"))}
    try:
        config = LoraConfig(**options)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"train.lora: peft.LoraConfig refuses it: {' '.join(str(err).split())}") from None
    problems = config_problems(config.to_dict())
    if problems:
        raise MapsTrainError(f"train.lora: vLLM could not serve this adapter: {'; '.join(problems)}")
    return config


def build_sft_config(recipe, adapter: str, precision: Precision, has_eval: bool = False):
    """trl.SFTConfig for one adapter: `train.sft` as written (our defaults under it), plus what maps-train decides:
    where checkpoints go, the machine's precision, W&B from the recipe, no evaluation without an eval split."""
    from trl import SFTConfig

    kwargs: dict[str, Any] = dict(recipe.train.sft)
    wandb_on = wandb_environment(recipe.wandb, recipe.name)
    kwargs.setdefault("run_name", f"{recipe.name}-{adapter}")
    kwargs.setdefault("report_to", ["wandb"] if wandb_on else "none")
    kwargs.setdefault("per_device_eval_batch_size", kwargs.get("per_device_train_batch_size", 8))
    if kwargs.get("gradient_checkpointing"):
        kwargs.setdefault("gradient_checkpointing_kwargs", {"use_reentrant": False})
    kwargs.update(
        output_dir=str(trainer_dir(recipe, adapter)),
        bf16=precision.bf16,
        use_cpu=on_cpu(),  # see distributed_state(): joins CPU ranks into one gloo group
    )
    if on_cpu():
        kwargs["fp16"] = False
    if not has_eval:
        kwargs["eval_strategy"] = "no"  # the trainer refuses an eval strategy without an eval set
    try:
        return SFTConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"train.sft: trl.SFTConfig refuses it: {' '.join(str(err).split())}") from None


def load_student(recipe, precision: Precision):
    """The base model (never resized: the adapter must fit the base vLLM serves)."""
    import torch
    from transformers import AutoModelForCausalLM

    from maps_train.models import resolve_model

    kwargs: dict[str, Any] = {"dtype": getattr(torch, precision.dtype)}
    if recipe.train.attn_implementation:
        kwargs["attn_implementation"] = recipe.train.attn_implementation
    return AutoModelForCausalLM.from_pretrained(resolve_model(recipe.train.student), **kwargs)


def load_tokenizer(recipe):
    from transformers import AutoTokenizer

    from maps_train.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(recipe.train.student))
    if not tokenizer.chat_template:
        raise MapsTrainError(f"train.student: {recipe.train.student} has no chat template (use an instruct model)")
    return tokenizer


def recorded_base_model(student: str) -> str:
    """What adapter_config.json names as base: the hub id when the student is one, else the local folder."""
    from maps_train.models import resolve_model

    resolved = resolve_model(student)
    is_hub_id = not student.startswith("builtin:") and not Path(student).expanduser().exists()
    return student if is_hub_id else str(Path(resolved).resolve())


def save_adapter(trainer, folder: Path, base_model: str) -> None:
    """Adapter weights and config only: no tokenizer (vLLM deprecates per-LoRA tokenizers), no trainer args."""
    trainer.save_model(str(folder))  # gathers ZeRO-3 shards where needed; every rank must call it
    if not trainer.accelerator.is_main_process:
        return
    for name in (*TOKENIZER_FILES, "training_args.bin"):
        (folder / name).unlink(missing_ok=True)
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base_model
    config["inference_mode"] = True
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def clear_adapter(recipe, adapter: str) -> None:
    """Forget a finished adapter (for --overwrite): its folder and its trainer state."""
    for folder in (adapter_output_dir(recipe, adapter), trainer_dir(recipe, adapter)):
        if folder.exists():
            shutil.rmtree(folder)


def loss_history(log_history: list[dict[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    """(step, value) of every log entry holding `key`: "loss" for training, "eval_loss" for the held-out split."""
    return [(entry["step"], float(entry[key])) for entry in log_history if key in entry]


def last_logged(state, key: str) -> float | None:
    """`key` as logged at the final step (e.g. the eval loss when the eval strategy already ran there), else None."""
    return next((float(entry[key]) for entry in reversed(state.log_history)
                 if entry.get("step") == state.global_step and key in entry), None)
