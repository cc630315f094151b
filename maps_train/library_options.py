"""The recipe's library sections: `train.sft` (trl.SFTConfig), `train.lora` (peft.LoraConfig), `rl.grpo`
(trl.GRPOConfig).

A section holds what the recipe sets: the keys below where maps-train departs from the library's default (each
with its reason), under the recipe's own. Every other option is the library's default, taken from the library's
own dataclass fields, never restated here (`tests/test_library_options.py` fails when a key below equals the
library's default). The options maps-train itself reads are typed once (`SFTOptions`, `LoraOptions`,
`GRPOOptions`) and resolved the same way for every stage that reads them: the plan sizes what the trainer runs.

Checking a section means importing TRL and PEFT: 7.8-9.7 s on the 2-core machine against 0.08 s for the rest of
a recipe load (measured 2026-12-04), paid by every command that loads a recipe (traces, eval, serve) for sections
it never uses. So the library's verdict on a section, and its defaults, are kept per installed library version
(and this module's code) under $MAPS_TRAIN_HOME/checks; a refused section is never kept and fails every time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from maps_train.config.typed import FieldError, check_dataclass_kwargs
from maps_train.paths import home, write_text_atomic

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
    """Which library dataclass judges a section, and which distributions' versions its verdict depends on."""

    kind: str
    module: str
    name: str
    distributions: tuple[str, ...]

    def cls(self) -> type:
        import importlib

        return getattr(importlib.import_module(self.module), self.name)


SFT = LibrarySection("sft", "trl", "SFTConfig", ("trl", "transformers"))
LORA = LibrarySection("lora", "peft", "LoraConfig", ("peft",))
GRPO = LibrarySection("grpo", "trl", "GRPOConfig", ("trl", "transformers"))


def remembered(section: LibrarySection, what: str, payload: Any, compute: Callable[[], Any]) -> Any:
    """`compute()`, kept under $MAPS_TRAIN_HOME/checks per installed version of the section's library, this
    module's code and `payload`. A value JSON would change (a tuple, say) is never kept; an unwritable home only
    loses the memo."""
    from importlib.metadata import version

    key = json.dumps({"what": what, "kind": section.kind, "payload": payload,
                      "versions": {name: version(name) for name in section.distributions},
                      "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}, sort_keys=True, default=repr)
    path = home() / "checks" / f"{section.kind}-{what}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not kept yet (or an unreadable entry): ask the library
    value = compute()
    try:
        text = json.dumps({"kind": section.kind, "value": value})
    except (TypeError, ValueError):
        return value
    if json.loads(text)["value"] != value:
        return value
    try:
        write_text_atomic(path, text)  # concurrent loads read a whole entry or none
    except OSError:
        pass
    return value


@functools.cache  # every `*Options.of` reads them: once a process (read-only to callers), then from the memo
def library_defaults(section: LibrarySection) -> dict[str, Any]:
    """Every field of the library's dataclass whose default JSON can hold, as the library declares it."""

    def compute() -> dict[str, Any]:
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

    return remembered(section, "defaults", None, compute)


def check_section(section: LibrarySection, options: dict[str, Any], reserved: Mapping[str, str]) -> dict[str, Any]:
    """`options` checked against the library's own fields (types coerced as the library declares them)."""
    for key in options:
        if key in reserved:
            raise FieldError(key, reserved[key])
    return remembered(section, "verdict", options,
                      lambda: check_dataclass_kwargs(section.cls(), options, section.name))


def check_sft_options(options: dict[str, Any]) -> dict[str, Any]:
    return check_section(SFT, options, SFT_RESERVED)


def check_lora_options(options: dict[str, Any]) -> dict[str, Any]:
    """Checked against LoraConfig's fields, then built once, so PEFT's own checks run when the recipe loads."""

    def verdict() -> dict[str, Any]:
        from peft import LoraConfig

        checked = check_dataclass_kwargs(LoraConfig, options, "LoraConfig")
        try:
            LoraConfig(**{**LORA_DEFAULTS, **checked})
        except (TypeError, ValueError) as err:
            raise FieldError("", f"peft.LoraConfig refuses it: {' '.join(str(err).split())}") from None
        return checked

    return remembered(LORA, "verdict", options, verdict)


def check_grpo_options(options: dict[str, Any]) -> dict[str, Any]:
    return check_section(GRPO, options, GRPO_RESERVED)


class ResolvedOptions:
    """Options of one library section, each the recipe's value else the library's default (`of`)."""

    section: ClassVar[LibrarySection]

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        values = {**library_defaults(cls.section), **options}
        return cls(**{item.name: values.get(item.name) for item in dataclasses.fields(cls)})


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
