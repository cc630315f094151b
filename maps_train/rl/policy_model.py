"""TRL's and PEFT's objects for one role: the `GRPOConfig` (`rl.grpo` as written, plus what maps-train decides),
the policy model (the distilled adapter trainable, or a fresh LoRA), and the dtype of TRL's colocated engine."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from maps_train.adapters import AdapterSet, rl_source_set
from maps_train.errors import MapsTrainError
from maps_train.platform import vllm_dtype, vllm_on_cpu
from maps_train.recipe import Recipe
from maps_train.rl.layout import adapter_name, policy_start, rl_trainer_dir
from maps_train.train import internals


def build_grpo_config(recipe: Recipe, role: str, bf16: bool, wandb_on: bool):
    """trl.GRPOConfig: `rl.grpo` as written (our defaults under it) plus what maps-train decides."""
    from trl import GRPOConfig

    from maps_train.rl.rewards import reward_weights
    from maps_train.train.sft import on_cpu, refuse_hub_token

    rl = recipe.rl
    refuse_hub_token(rl.grpo, "rl.grpo")  # never into the checkpoints' training_args.bin
    kwargs: dict[str, Any] = dict(rl.grpo)
    if wandb_on and not kwargs.get("report_to"):
        kwargs["report_to"] = ["wandb"]
    kwargs.setdefault("run_name", f"{recipe.name}-rl-{role}")
    # Several ranks: every trainable (policy LoRA) weight gets a gradient each step, TRL's "ref" copy is frozen, so
    # DDP need not search the graph for unused ones (transformers does for a PeftModel, with a warning every step).
    kwargs.setdefault("ddp_find_unused_parameters", False)
    kwargs.update(
        output_dir=str(rl_trainer_dir(recipe, role)),
        num_generations=rl.num_generations,
        max_completion_length=rl.max_completion_tokens,
        temperature=rl.temperature,
        reward_weights=reward_weights(rl.reward_for(role)),
        bf16=bf16,
        use_cpu=on_cpu(),
        use_vllm=rl.rollout == "vllm",
    )
    if rl.rollout == "vllm":
        # Prompts are fitted to leave max_completion_tokens within backend.max_model_len (llm.prompt_fit.fit_request);
        # without it TRL's colocated engine would reserve the model's whole context.
        kwargs.setdefault("vllm_max_model_length", recipe.backend.max_model_len)
    if on_cpu():
        kwargs["fp16"] = False
    try:
        return GRPOConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"rl.grpo: trl.GRPOConfig refuses it: {' '.join(str(err).split())}") from None


def load_policy_model(recipe: Recipe, role: str, dtype: str, adapters: AdapterSet | None = None):
    """(model, peft_config): the student with `role`'s adapter of `adapters` (default: RL's starting set,
    `adapters.rl_source_set`) as a trainable PeftModel (TRL then copies it as the frozen "ref" adapter), or the
    bare student and `train.lora` for a fresh adapter (`rl.init: base`, or an adapter that learned nothing:
    `rl.layout.policy_start`)."""
    from maps_train.train import sft

    adapters = adapters if adapters is not None else rl_source_set(recipe)
    model = sft.load_student(recipe, sft.Precision(dtype=dtype, bf16=False))
    source = policy_start(recipe.rl.init, adapters, role)
    if source is None:
        lora = sft.build_lora_config(recipe.train)
        lora.lora_dropout = 0.0  # see without_dropout
        return model, lora
    from peft import PeftModel

    from maps_train.models.resolve import require_safetensors_adapter

    if not (source / "adapter_config.json").is_file():
        raise MapsTrainError(f"{source}: no distilled adapter for rl.roles '{role}' (rl.init: distilled reads "
                             "rl.adapters_dir, else serve.adapters_dir, else train.output_dir; rl.init: base starts "
                             "a fresh LoRA)")
    require_safetensors_adapter(source, f"rl.adapters_dir/{adapter_name(recipe, role)}")
    return without_dropout(PeftModel.from_pretrained(model, str(source), is_trainable=True)), None


def without_dropout(model):
    """Every dropout of the policy off. TRL scores the sampled tokens with the model in train mode, where LoRA
    dropout would make the log-probabilities it trains on differ from the ones the tokens were sampled with (the
    policy samples in eval mode): the importance ratio would be noise, not the policy's change."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def colocated_engine_dtype(recipe: Recipe, args):
    """The dtype TRL's colocated engine starts in on vLLM-CPU (`maps_train.rl.vllm_policy.engine_dtype`: the
    project's own choice there, float32 on AVX2-only CPUs); elsewhere TRL's own call, unchanged. Its core runs in
    this process, hence the kernel-scan guard around it (`maps_train.llm.vllm_internals.vllm_kernel_scan_guard`)."""
    if not (args.use_vllm and args.vllm_mode == "colocate" and vllm_on_cpu()):
        return nullcontext()
    return internals.trl_engine_dtype(vllm_dtype(recipe.backend.dtype, cpu=True))
