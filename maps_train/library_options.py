"""The recipe's library sections: `train.sft` (trl.SFTConfig), `train.lora` (peft.LoraConfig), `rl.grpo`
(trl.GRPOConfig).

A section holds what the recipe sets: the keys below where maps-train departs from the library's default (each
with its reason), under the recipe's own. Every other option is the library's default, taken from the library's
own dataclass fields, never restated here (`tests/test_library_options.py` fails when a key below equals the
library's default). The options maps-train itself reads are typed once (`SFTOptions`, `LoraOptions`,
`GRPOOptions`) and resolved the same way for every stage that reads them: the plan sizes what the trainer runs.

Checking a section means importing TRL and PEFT (several seconds), so a recipe load checks only what needs no
library (the keys maps-train sets itself, refused); the stage that builds the library's object checks the section
against the library's own fields (`check_library_sections`: `train` for train.sft and train.lora, `rl` for rl.grpo
and train.lora), as alignment-handbook builds `SFTConfig` only in its SFT script. The options maps-train reads are
typed here and checked when read (`ResolvedOptions.of`), without the library where the section states them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from maps_train.config.typed import FieldError, check_dataclass_kwargs, coerce
from maps_train.errors import ConfigError

# train.sft: where TRL's SFTConfig default does not fit role adapters on a small student.
SFT_DEFAULTS: dict[str, Any] = {
    "learning_rate": 2e-4,  # a LoRA rate (TRL's 2e-5 is a full fine-tune's)
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,  # below 1: a fraction of the training steps (transformers v5 folded warmup_ratio in)
    "num_train_epochs": 1.0,  # the SFT sets are rejection-sampled already; 3 epochs overfit a few hundred rows
    "max_length": 2048,  # a role prompt with 5 passages and the observations (TRL's 1024 cuts the completion off)
    "completion_only_loss": True,  # loss on the role's completion only (prompt-completion rows), stated
    "bf16": False,  # bf16 autocast: on GPU; on CPU only with bf16 instructions (AVX512-BF16, AMX), else float32
    "gradient_checkpointing": False,  # a 135M-4B student's activations fit; checkpointing costs a third more time
    "eval_strategy": "steps",  # every eval_steps (null: logging_steps) when the SFT set has eval.jsonl; else "no"
    "save_total_limit": 2,  # LoRA checkpoints under <output_dir>/_trainer/<adapter>; a rerun resumes from the last
    "seed": 0,
    "ddp_find_unused_parameters": False,  # every LoRA weight gets a gradient each step
}
# Set by maps-train itself, so a recipe value would be silently replaced: refused with the reason.
SFT_RESERVED = {
    "output_dir": "set by maps-train to <train.output_dir>/_trainer/<adapter> (set train.output_dir)",
    "use_cpu": "set by maps-train from the machine (CPU ranks join one gloo group)",
}
# train.lora: PEFT's LoraConfig defaults to r 8 on no modules.
LORA_DEFAULTS: dict[str, Any] = {
    "r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": "all-linear",  # here: every attention and MLP projection, the modules vLLM serves LoRA on
    "task_type": "CAUSAL_LM",
}
# rl.grpo: where TRL's GRPOConfig default does not fit GRPO on role adapters.
GRPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-5,  # a LoRA rate (TRL's 1e-6 is a full fine-tune's)
    "beta": 0.04,  # KL to the starting adapter (TRL keeps a frozen copy of it as the "ref" adapter)
    "per_device_train_batch_size": 4,  # rollouts per device per step: a multiple of rl.num_generations
    "max_steps": 100,
    "logging_steps": 1,  # a few hundred steps at most: every step's reward parts on the curves
    "save_steps": 10,
    "save_total_limit": 2,
    "bf16": False,
    "seed": 0,
    "report_to": [],  # maps-train opens the W&B run itself (wandb: section), like the SFT stage
    # Advantages in reward units (reward - group mean), not divided by the group's std (TRL's "group"): with the
    # std, branches that tie on correctness and differ by a few tokens of cost get unit-size advantages, and
    # lambda loses its meaning (Dr. GRPO, Liu et al. 2025, drops the std for the same bias).
    "scale_rewards": "none",
    # A completion cut at max_completion_length is left out of the loss: its tokens never ended the call.
    "mask_truncated_completions": True,
}
# Set by maps-train from the `rl:` section, so a value under rl.grpo would be silently replaced: refused.
GRPO_RESERVED = {
    "output_dir": "set by maps-train to <rl.output_dir>/_trainer/<role>",
    "num_generations": "set from rl.num_generations",
    "max_completion_length": "set from rl.max_completion_tokens",
    "temperature": "set from rl.temperature",
    "reward_weights": "set from rl.reward (one weight per reward part)",
    "use_cpu": "set by maps-train from the machine",
    "use_vllm": "set from rl.rollout (vllm: TRL's vLLM samples the trained calls)",
}


@dataclass(frozen=True)
class LibrarySection:
    """Which library dataclass judges a section, where the section lies in a recipe, and what maps-train sets."""

    key: str
    module: str
    name: str
    reserved: Mapping[str, str] = dataclasses.field(compare=False)  # key -> why maps-train sets it (refused)

    def cls(self) -> type:
        import importlib

        return getattr(importlib.import_module(self.module), self.name)


SFT = LibrarySection("train.sft", "trl", "SFTConfig", SFT_RESERVED)
LORA = LibrarySection("train.lora", "peft", "LoraConfig", {})
GRPO = LibrarySection("rl.grpo", "trl", "GRPOConfig", GRPO_RESERVED)
STAGE_SECTIONS = {"train": (SFT, LORA), "rl": (GRPO, LORA)}  # rl.init base trains a fresh LoRA from train.lora


@functools.cache  # every `*Options.of` that needs one reads them: once a process (read-only to callers)
def library_defaults(section: LibrarySection) -> dict[str, Any]:
    """Every field of the library's dataclass whose default JSON can hold, as the library declares it."""
    defaults = {}
    for item in dataclasses.fields(section.cls()):
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            continue
        try:
            if json.loads(json.dumps(value)) == value:
                defaults[item.name] = value
        except (TypeError, ValueError):
            continue  # an object default (an enum, a callable): no option maps-train reads
    return defaults


def refuse_reserved(section: LibrarySection) -> Any:
    """The recipe-load check of a library section (field metadata): the keys maps-train sets itself are refused
    with the reason; everything else waits for the stage that builds the library's object."""

    def check(options: dict[str, Any]) -> dict[str, Any]:
        for key in options:
            if key in section.reserved:
                raise FieldError(str(key), section.reserved[key])
        return options

    return check


check_sft_options = refuse_reserved(SFT)
check_grpo_options = refuse_reserved(GRPO)
check_lora_options = refuse_reserved(LORA)


def _section_error(recipe: Any, key: str, message: str) -> ConfigError:
    """One line naming the recipe file that set `key` (when the recipe was loaded from one) and the key."""
    from maps_train.config.overlays import sources_of

    sources = sources_of(recipe)
    return ConfigError(f"{sources.at(key)}: {key}: {message}" if sources is not None else f"{key}: {message}")


def check_section(recipe: Any, section: LibrarySection) -> dict[str, Any]:
    """The recipe's `section` checked by the library: every key one of its dataclass's fields (else the nearest
    name), every value coerced to the field's annotation (YAML's "1e-4" string becomes a float), and for LoRA the
    object built, so PEFT's own checks run. The section is replaced by its coerced values and returned."""
    owner, name = section.key.split(".")
    options = getattr(getattr(recipe, owner), name)
    try:
        checked = check_dataclass_kwargs(section.cls(), options, section.name)
    except FieldError as err:
        raise _section_error(recipe, f"{section.key}.{err.key}", err.message) from None
    if section is LORA:
        from peft import LoraConfig

        try:
            LoraConfig(**checked)
        except (TypeError, ValueError) as err:
            refusal = f"peft.LoraConfig refuses it: {' '.join(str(err).split())}"
            raise _section_error(recipe, section.key, refusal) from None
    setattr(getattr(recipe, owner), name, checked)
    return checked


def check_library_sections(recipe: Any, stage: str) -> None:
    """Check the library sections `stage` ("train" or "rl") builds its library objects from, in place (see
    `check_section`); a bad key or value is one ConfigError line naming the file and the dotted key."""
    for section in STAGE_SECTIONS[stage]:
        check_section(recipe, section)


class ResolvedOptions:
    """Options of one library section, each the recipe's value else the library's default (`of`)."""

    section: ClassVar[LibrarySection]

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        """The options, each checked against this class's annotation (a one-line error naming the key); the library
        is imported for its defaults only when `options` leaves one of them unset."""
        names = [item.name for item in dataclasses.fields(cls)]
        values = dict(options)
        if any(name not in values for name in names):
            values = {**library_defaults(cls.section), **values}
        hints = _hints(cls)
        return cls(**{name: None if values.get(name) is None else
                      coerce(values[name], hints[name], f"{cls.section.key}.{name}") for name in names})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


@dataclass(frozen=True)
class SFTOptions(ResolvedOptions):
    """The `train.sft` options maps-train reads (plan, sft-data, the trainer's precision), library defaults under."""

    section: ClassVar[LibrarySection] = SFT

    max_length: int | None
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    bf16: bool | None


@dataclass(frozen=True)
class LoraOptions(ResolvedOptions):
    """The `train.lora` options maps-train reads (plan, serve's max LoRA rank, the W&B summary)."""

    section: ClassVar[LibrarySection] = LORA

    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str | list[str] | None


@dataclass(frozen=True)
class GRPOOptions(ResolvedOptions):
    """The `rl.grpo` options maps-train reads (plan, the trainer's checks, the recorded reward settings)."""

    section: ClassVar[LibrarySection] = GRPO

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    bf16: bool | None
    beta: float
    scale_rewards: str | bool
    mask_truncated_completions: bool
    vllm_mode: str
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None
    vllm_enable_sleep_mode: bool
    vllm_tensor_parallel_size: int
    vllm_importance_sampling_correction: bool
