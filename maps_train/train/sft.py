"""From a recipe's `train` section to TRL/PEFT objects, and an adapter folder vLLM can serve.

Kept apart from the entry point so tests and benchmarks build exactly the configs the launcher uses.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.tracking import wandb_environment
from maps_train.train.adapter_check import SUPPORTED_MODULES, TOKENIZER_FILES

SUMMARY_FILE = "train_summary.json"  # written last: its presence marks a finished adapter
TRAINER_SUBDIR = "_trainer"  # checkpoints and trainer state, kept out of the adapter folders


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
    """CPU: float32 throughout (bf16 is slow there and degrades small models); GPU: bf16 when `train.bf16`."""
    if on_cpu():
        return Precision(dtype="float32" if train.dtype == "auto" else train.dtype, bf16=False)
    if train.dtype != "auto":
        return Precision(dtype=train.dtype, bf16=train.bf16)
    return Precision(dtype="bfloat16" if train.bf16 else "float32", bf16=train.bf16)


def adapter_output_dir(recipe, adapter: str) -> Path:
    return Path(recipe.train.output_dir) / adapter


def trainer_dir(recipe, adapter: str) -> Path:
    return Path(recipe.train.output_dir) / TRAINER_SUBDIR / adapter


def is_trained(recipe, adapter: str) -> bool:
    return (adapter_output_dir(recipe, adapter) / SUMMARY_FILE).is_file()


def lora_target_modules(train) -> list[str] | str:
    """`all-linear` means every attention and MLP projection (PEFT's all-linear leaves lm_head out too)."""
    if train.target_modules == "all-linear":
        return list(SUPPORTED_MODULES)
    targets = [train.target_modules] if isinstance(train.target_modules, str) else list(train.target_modules)
    bad = [name for name in targets if name not in SUPPORTED_MODULES]
    if bad:
        raise MapsTrainError(
            f"train.target_modules: {bad[0]!r} is not servable by vLLM's LoRA (use {', '.join(SUPPORTED_MODULES)})"
        )
    return targets


def build_lora_config(train):
    from peft import LoraConfig

    from maps_train.train.adapter_check import rank_problem

    if (why := rank_problem(train.lora_r)) is not None:
        raise MapsTrainError(f"train.lora_r: {why}")
    return LoraConfig(
        r=train.lora_r,
        lora_alpha=train.lora_alpha,
        lora_dropout=train.lora_dropout,
        target_modules=lora_target_modules(train),
        bias="none",
        task_type="CAUSAL_LM",
    )


def build_sft_config(recipe, adapter: str, precision: Precision):
    """The `trl.SFTConfig` for one adapter; `train.sft_kwargs` overrides any field."""
    from trl import SFTConfig

    train = recipe.train
    kwargs: dict[str, Any] = dict(
        output_dir=str(trainer_dir(recipe, adapter)),
        run_name=f"{recipe.name}-{adapter}",
        learning_rate=train.learning_rate,
        num_train_epochs=train.num_train_epochs,
        max_steps=train.max_steps,
        per_device_train_batch_size=train.per_device_train_batch_size,
        per_device_eval_batch_size=train.per_device_train_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_steps,
        weight_decay=train.weight_decay,
        max_length=train.max_length,
        packing=train.packing,
        completion_only_loss=train.completion_only_loss,
        assistant_only_loss=False,  # prompt-completion rows: the completion mask needs no template markers
        bf16=precision.bf16,
        fp16=False,
        use_cpu=on_cpu(),  # see distributed_state(): joins CPU ranks into one gloo group
        gradient_checkpointing=train.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if train.gradient_checkpointing else None,
        logging_steps=train.logging_steps,
        save_strategy="steps",
        save_steps=train.save_steps,
        save_total_limit=2,
        save_only_model=False,
        eval_strategy="no",
        seed=train.seed,
        report_to=["wandb"] if wandb_environment(recipe.wandb, recipe.name) else "none",
        ddp_find_unused_parameters=False,  # every LoRA weight gets a gradient each step
        dataset_num_proc=None,
        model_init_kwargs=None,
    )
    unknown = set(train.sft_kwargs) - set(SFTConfig.__dataclass_fields__)
    if unknown:
        raise MapsTrainError(f"train.sft_kwargs.{min(unknown)}: not a trl.SFTConfig field")
    kwargs.update(train.sft_kwargs)
    return SFTConfig(**kwargs)


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


def loss_history(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(entry["step"], float(entry["loss"])) for entry in log_history if "loss" in entry]
