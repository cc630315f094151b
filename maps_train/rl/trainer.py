"""GRPO on one role adapter after another: TRL's `GRPOTrainer` with a `rollout_func` that plays MAPS.

For each role of `rl.roles` (in order; each RL'd adapter then serves its roles in the environment of the next,
where its route names an adapter folder: hf or vllm):

- the policy: the student (`train.student`) with the role's adapter loaded from RL's starting adapter set
  (`rl.init: distilled`: `adapters.rl_source_set`, rl.adapters_dir, else serve.adapters_dir, else
  train.output_dir; the set the environment serves too) as a TRAINABLE `PeftModel`, so
  TRL keeps a frozen copy of it as the "ref" adapter and `rl.grpo.beta` weighs the KL to the distilled policy; or
  (`rl.init: base`) a fresh LoRA from `train.lora`, whose reference is the base model;
- the environment: the calls RL does not train, answered as `rl.environment` says (the distilled student by
  default: `environment_recipe`, from the same adapter set), retrieval through the recipe's retriever;
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
  -> RL adapter and its sha256) and the last step's metrics of every role trained; `<rl.output_dir>/adapters/
  adapters.json`: the adapter set RL leaves (its RL adapters, the starting set's others); `<rl.output_dir>/curves-<role>.png`
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

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from maps_train.adapters import AdapterSet, rl_source_set
from maps_train.adapters.set import weights_sha256
from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions
from maps_train.llm.vllm_internals import vllm_kernel_scan_guard
from maps_train.platform import vllm_on_cpu
from maps_train.questions import Question
from maps_train.recipe import Recipe
from maps_train.rl.checkpoints import checkpoint_step, restore_policy_adapter, state_of_checkpoint
from maps_train.rl.checks import check_rl_config
from maps_train.rl.curves import plot_rl_curves
from maps_train.rl.environment import load_rl_questions
from maps_train.rl.layout import SUMMARY_FILE, RoleRun, is_main_rank
from maps_train.rl.policy_model import build_policy, colocated_engine
from maps_train.rl.rewards import reward_functions
from maps_train.rl.rollout import HitLog
from maps_train.rl.rollout_func import MapsRollouts
from maps_train.train import internals

logger = logging.getLogger(__name__)


def train_role(run: RoleRun, recipe: Recipe, questions: list[Question], retriever: Any, adapters: AdapterSet,
               environment_backends: Mapping[str, Any] | None = None, echo=logger.info) -> dict[str, Any]:
    """GRPO on `run`'s adapter, starting from its adapter in `adapters`, in `recipe`'s MAPS with the student with
    `adapters` answering the calls RL does not train (`rl.environment`); saves the adapter, checks it and returns
    its summary (also its rl_summary.json)."""
    import os

    from datasets import Dataset
    from trl import GRPOTrainer

    from maps_train import tracking
    from maps_train.train import sft

    # TRL warns that rollout_func is experimental on every start; docs/rl.md says so once, with the TRL version.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    internals.check_trl_version()
    started = time.time()
    run.claim_folders()
    if is_main_rank():
        run.record_reward_settings()
    policy = build_policy(run, adapters, tracking.wandb_environment(run.wandb, run.name))
    trained_roles = run.trained_roles(adapters)
    retrieved = HitLog(retriever)  # the evidence reward matches golds by title and text against these
    funcs = reward_functions(run.rl.reward_for(run.role), trained_roles, retrieved.passages)
    rollouts = MapsRollouts(recipe, run.role, {q.id: q for q in questions}, retrieved, trained_roles, adapters,
                            environment_backends)
    with vllm_kernel_scan_guard(), colocated_engine(run, policy.args):
        trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=funcs,
            args=policy.args,
            train_dataset=Dataset.from_list([{"prompt": q.id} for q in questions]),
            processing_class=policy.tokenizer,
            peft_config=policy.peft_config,
            rollout_func=rollouts,
        )
    if run.rl.rollout == "vllm" and policy.args.vllm_mode == "colocate" and vllm_on_cpu():
        # vLLM-CPU refuses TRL's load_weights after repacking its layers: same weights, vLLM's in-place reload.
        internals.sync_weights_in_place(trainer)
    last_checkpoint = sft.last_complete_checkpoint(run.trainer_dir)
    if last_checkpoint:
        echo(f"rl {run.role}: resuming from {last_checkpoint}")
        restore_policy_adapter(trainer, Path(last_checkpoint))
    try:
        if last_checkpoint and checkpoint_step(Path(last_checkpoint)) >= policy.args.max_steps > 0:
            # The Trainer checks max_steps only after a step: resumed at the last step, it would train one more.
            echo(f"rl {run.role}: {last_checkpoint} holds the last step ({policy.args.max_steps}): saving it, no "
                 "step more")
            result = state_of_checkpoint(trainer, Path(last_checkpoint))
        else:
            result = trainer.train(resume_from_checkpoint=last_checkpoint)
    finally:
        rollouts.close()
    if trainer.state.global_step < 1:
        raise MapsTrainError(f"rl {run.role}: no GRPO step was trained (rl.grpo.max_steps, rl.limit); nothing is "
                             "saved as finished")
    trainer.save_state()

    sft.save_adapter(trainer, run.adapter_dir, sft.recorded_base_model(run.train.student))  # checked as vLLM loads it
    summary: dict[str, Any] = {}
    if trainer.accelerator.is_main_process:
        summary = role_summary(run, adapters, trainer, result, time.time() - started)
        run.summary_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")  # last: finished
        record_artifacts(run, summary)
        curves = plot_rl_curves(trainer.state.log_history, run.curves_png, run.curves_title)
        echo(f"rl {run.role}: curves {curves}")
    trainer.accelerator.wait_for_everyone()
    return summary


def role_summary(run: RoleRun, adapters: AdapterSet, trainer, result, seconds: float) -> dict[str, Any]:
    """What the Trainer's own records (trainer_state.json) do not say: lineage, roles, the last logged metrics."""
    source = run.policy_start(adapters)
    last = next((entry for entry in reversed(trainer.state.log_history) if "reward" in entry), {})
    return {
        "recipe": run.name,
        "role": run.role,
        "adapter": run.adapter,
        "trained_roles": run.trained_roles(adapters),
        "student": run.train.student,
        "init": run.rl.init,
        "source_adapter": str(source) if source else None,
        "source_sha256": weights_sha256(source),
        "rl_adapter": str(run.adapter_dir),
        "rl_sha256": weights_sha256(run.adapter_dir),
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "last_metrics": last,
        "num_generations": run.rl.num_generations,
        "rollout": "hf" if run.rl.rollout == "hf" else f"vllm/{trainer.args.vllm_mode}",
        "beta": GRPOOptions.of(run.rl.grpo).beta,
        "reward_settings": run.reward_settings(),
        "wall_seconds": round(seconds, 2),
    }


def record_artifacts(run: RoleRun, summary: dict[str, Any]) -> None:
    """Link the distilled adapter (read) and the RL adapter (written) in the W&B run TRL's integration opened, then
    end it, so the next role gets a run of its own. Nothing happens with W&B off."""
    from maps_train import tracking
    from maps_train.train.sft import adapter_artifact

    tracker = tracking.active_tracker()
    if summary["source_adapter"]:
        tracker.use_artifact(adapter_artifact(run.name, run.adapter), "adapter", summary["source_adapter"])
    metadata = {key: summary[key] for key in ("global_step", "source_sha256", "student") if summary.get(key)}
    tracker.log_artifact(tracking.artifact_name("rl-adapter", f"{run.name}-{run.adapter}"), "adapter",
                         summary["rl_adapter"], metadata=metadata)
    tracker.finish_run()


def _say_nothing(_message: str) -> None:
    """The echo of ranks other than 0: one line per event, not one per rank."""


def rl_stage(recipe: Recipe, *, retriever: Any = None, environment_backends: Mapping[str, Any] | None = None,
             echo=logger.info) -> dict[str, Any]:
    """`maps-train rl`: check the recipe, hold `rl.output_dir`, read the training questions, build the retriever
    (several ranks on a machine search one service, rl/shared_retrieval.py) and RL's starting adapter set
    (`adapters.rl_source_set`), then `run_rl`. Writes (rank 0) and returns `<rl.output_dir>/rl_summary.json`."""
    from contextlib import nullcontext

    from maps_train.runlock import sole_writer

    rank0 = is_main_rank()
    check_rl_config(recipe)
    # One run per output folder (rank 0 holds it for the launch): two would interleave checkpoints and adapters.
    with sole_writer(Path(recipe.rl.output_dir), "maps-train rl") if rank0 else nullcontext():
        questions = load_rl_questions(recipe)
        if retriever is None:
            from maps_train.rl.shared_retrieval import rank_retriever

            retriever, _service = rank_retriever(recipe)  # the service ends with this process
        return run_rl(recipe, questions, retriever, rl_source_set(recipe), environment_backends=environment_backends,
                      echo=echo)


def run_rl(recipe: Recipe, questions: list[Question], retriever: Any, adapters: AdapterSet, *,
           environment_backends: Mapping[str, Any] | None = None, echo=logger.info) -> dict[str, Any]:
    """Every role of `rl.roles` in turn (finished ones skipped), each policy starting from its adapter in `adapters`
    and playing against the student with `adapters` (the roles RL'd before it in place); writes (rank 0) and
    returns `<rl.output_dir>/rl_summary.json`, and the adapter set it leaves (`<rl.output_dir>/adapters/`)."""
    from maps_train.paths import write_text_atomic

    rank0 = is_main_rank()
    say = echo if rank0 else _say_nothing  # every rank trains; rank 0 reports
    summaries: dict[str, Any] = {}
    for role in recipe.rl.roles:
        run = RoleRun.of(recipe, role)
        if run.is_finished():
            say(f"rl {role}: already trained ({run.summary_file})")
        else:
            train_role(run, recipe, questions, retriever, adapters, environment_backends, say)
            say(f"rl {role}: {run.adapter_dir}")
        summaries[role] = summary = json.loads(run.summary_file.read_text(encoding="utf-8"))
        adapters = run.with_rl_adapter(adapters, summary["trained_roles"], summary.get("source_adapter"),
                                       summary.get("rl_sha256"))
    lineage = [{key: s[key] for key in ("source_adapter", "source_sha256", "rl_adapter", "rl_sha256")}
               for s in summaries.values()]  # source null: a fresh LoRA (rl.init: base, or an SFT adapter that learned nothing)
    overall = {"recipe": recipe.name, "lineage": lineage, "roles": summaries}
    if rank0:
        path = Path(recipe.rl.output_dir) / SUMMARY_FILE
        write_text_atomic(path, json.dumps(overall, indent=2) + "\n")
        echo(f"rl: wrote {path} and {adapters.write()}")  # echo, not say: one line per rank that writes it
    return overall
