"""LoRA SFT of the student on one role's SFT set (TRL `SFTTrainer` + PEFT), the entry point for `accelerate launch`.

Usage:

# One GPU node, DDP (ZeRO-2/3: recipes/accelerate/zero2.yaml, zero3.yaml); one adapter. GPUS: the GPU count
# (these configs set none; `maps-train train` passes one rank per visible GPU itself):
accelerate launch --config_file recipes/accelerate/ddp.yaml --num_processes GPUS -m maps_train.train \
    --config recipes/distill/qwen3-4b.yaml --role proposer train.sft.learning_rate=1e-4

# Every adapter of the recipe, one after another in the same ranks (memory freed between adapters):
accelerate launch --config_file recipes/accelerate/ddp.yaml --num_processes GPUS -m maps_train.train \
    --config recipes/distill/qwen3-4b.yaml --role all

# Two ranks on a CPU-only machine (gloo; a MULTI_CPU config file would quietly start only one process):
accelerate launch --config_file recipes/accelerate/cpu2.yaml --main_process_port 29517 -m maps_train.train \
    --config recipes/distill/qwen3-0.6b.yaml --role writer train.student=builtin:tiny-qwen3

# The one command for users: one `accelerate launch` per adapter (a fresh process each, finished ones skipped):
maps-train train recipes/distill/qwen3-4b.yaml --role all --accelerate-config recipes/accelerate/ddp.yaml

Reads `<sft>/<adapter>/train.jsonl` (and `eval.jsonl` when present: its loss is logged every `eval_steps`; `<sft>`
is train.sft_dir, else where `maps-train sft-data` wrote the recipe's sets), writes the adapter to
`<train.output_dir>/<adapter>/` (weights, adapter_config.json, train_summary.json; no tokenizer files), the
adapter set's manifest `<train.output_dir>/adapters.json` (`maps_train.adapters`), and
trainer checkpoints to `<train.output_dir>/_trainer/<adapter>/`, beside the Trainer's own records of the run
(`trainer_state.json`: global step and log history, every loss and eval loss; `train_results.json`,
`eval_results.json`, `all_results.json`: its final metrics). train_summary.json holds only what the Trainer does not
record (recipe, sources, LoRA, precision, rows, throughput). A finished adapter (its train_summary.json exists) is
skipped unless --overwrite; an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time

from maps_train.errors import MapsTrainError
from maps_train.library_options import LoraOptions, SFTOptions, check_library_sections
from maps_train.platform import apply_runtime_defaults

logger = logging.getLogger("maps_train.train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m maps_train.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a recipe YAML (recipes/distill/*.yaml)")
    parser.add_argument("--role", default="all", help="an adapter name (sft_data.adapter_roles key), 'shared' or 'all'")
    parser.add_argument("--overwrite", action="store_true", help="retrain adapters that are already finished")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides, e.g. train.max_steps=100")
    return parser.parse_args(argv)


def train_one(recipe, adapter: str, overwrite: bool = False) -> dict | None:
    """Train, save and check one adapter; returns its summary (None when it was already finished)."""
    import torch
    from transformers import set_seed
    from trl import SFTTrainer

    from maps_train.train import callbacks, data, internals, sft
    from maps_train.train.lm_head import score_labelled_positions_only

    check_library_sections(recipe, "train")  # train.sft and train.lora as TRL and PEFT type them
    state = sft.distributed_state()
    out_dir = sft.adapter_output_dir(recipe, adapter)
    if sft.is_trained(recipe, adapter) and not overwrite:
        if state.is_main_process:
            logger.info("%s: already trained (%s exists); --overwrite retrains it", out_dir, sft.SUMMARY_FILE)
        return None
    sft.prepare_output_dirs(recipe, adapter, overwrite, state)  # --overwrite removes only folders it marked
    state.wait_for_everyone()
    started = time.time()
    if data.train_row_count(recipe, adapter) == 0:  # every role under the floor: the base model serves them
        return record_unlearned(recipe, adapter, out_dir, state)

    ###############
    # Data
    ###############
    train_set, eval_set = data.load_adapter_datasets(recipe, adapter)
    logger.info("%s: %d train rows, %d eval rows", adapter, len(train_set), len(eval_set) if eval_set else 0)

    ###############
    # Tokenizer
    ###############
    tokenizer = sft.load_tokenizer(recipe.train.student)

    ###############
    # Trainer config (before the model, so ZeRO-3 can shard it as it loads)
    ###############
    precision = sft.choose_precision(SFTOptions.of(recipe.train.sft).bf16, recipe.train.dtype)
    training_args = sft.build_sft_config(recipe, adapter, precision, has_eval=eval_set is not None)
    set_seed(training_args.seed)

    ###############
    # Model
    ###############
    model = sft.load_student(recipe.train, precision)
    vocab_before = model.get_input_embeddings().num_embeddings

    ###############
    # Trainer (its fused LM head scoring completion positions only, on the CPU too)
    ###############
    internals.check_trl_version()
    score_labelled_positions_only()
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=sft.build_lora_config(recipe.train),
    )
    throughput = callbacks.TokensPerSecondCallback()
    callbacks.install(trainer, throughput)
    if trainer.model.get_input_embeddings().num_embeddings != vocab_before:
        raise MapsTrainError(f"train.student: the vocabulary was resized during setup; vLLM would reject {adapter}")

    ###############
    # Train (resuming from the last checkpoint of an interrupted run)
    ###############
    checkpoints = sft.trainer_dir(recipe, adapter)
    last_checkpoint = sft.last_complete_checkpoint(checkpoints)
    if last_checkpoint:
        logger.info("%s: resuming from %s", adapter, last_checkpoint)
    result = trainer.train(resume_from_checkpoint=last_checkpoint)
    eval_metrics = final_eval_metrics(trainer) if eval_set is not None else {}
    save_trainer_records(trainer, result.metrics, eval_metrics)

    ###############
    # Save (adapter only, checked the way vLLM will load it)
    ###############
    base_model = sft.recorded_base_model(recipe.train.student)
    sft.save_adapter(trainer, out_dir, base_model)  # checked (rank 0) the way vLLM will load it
    summary = None
    if state.is_main_process:
        summary = {
            "recipe": recipe.name,
            "adapter": adapter,
            "sft_sources": data.source_adapters(recipe, adapter),
            "trace_roles": sorted(
                {r for name in data.source_adapters(recipe, adapter) for r in recipe.sft_data.adapter_roles[name]}
            ),
            "student": recipe.train.student,
            "base_model_name_or_path": base_model,
            "lora_r": LoraOptions.of(recipe.train.lora).r,
            "lora_alpha": LoraOptions.of(recipe.train.lora).lora_alpha,
            "packing": training_args.packing,
            "dtype": precision.dtype,
            "bf16": precision.bf16,
            "world_size": training_args.world_size,
            "train_rows": len(train_set),
            "rows_per_role": data.rows_per_role(recipe, adapter),
            "eval_rows": len(eval_set) if eval_set is not None else 0,
            **throughput.summary(),
            "wall_seconds": round(time.time() - started, 2),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
        }
        # Written last: its presence marks the adapter finished (see sft.is_trained).
        (out_dir / sft.SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        logger.info("%s: saved to %s (%.1f train tokens/s)", adapter, out_dir, summary["train_tokens_per_second"])
        artifact_metrics = {"train_loss": result.training_loss, "eval_loss": eval_metrics.get("eval_loss"),
                            "global_step": trainer.state.global_step, "student": recipe.train.student}
        record_artifacts(recipe, adapter, out_dir, artifact_metrics)
    state.wait_for_everyone()

    # Release this adapter's model before the next one (--role all runs several in these ranks).
    del trainer, model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary


def record_unlearned(recipe, adapter: str, out_dir, state) -> dict:
    """An adapter with no rows (`maps_train.train.unlearned`): no weights, a summary that says so (main rank)."""
    from maps_train.train import sft
    from maps_train.train.unlearned import unlearned_summary

    summary = unlearned_summary(recipe, adapter)
    if state.is_main_process:
        (out_dir / sft.SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")  # written last, as below
        logger.warning("%s: no SFT rows, not trained: its roles (%s) are served by the base model (%s)",
                       adapter, ", ".join(summary["trace_roles"]), out_dir / sft.SUMMARY_FILE)
    state.wait_for_everyone()
    return summary


def final_eval_metrics(trainer) -> dict:
    """The held-out metrics of the final weights: those the eval strategy logged at the last step, else one
    `evaluate()` (every rank must call it; it is logged like the rest)."""
    at_last_step = next((entry for entry in reversed(trainer.state.log_history)
                         if entry.get("step") == trainer.state.global_step and "eval_loss" in entry), None)
    if at_last_step is None:
        return trainer.evaluate()
    return {key: value for key, value in at_last_step.items() if key.startswith("eval_")}


def save_trainer_records(trainer, train_metrics: dict, eval_metrics: dict) -> None:
    """The Trainer's own records, into its output folder: metrics in the log and in `*_results.json`, state (global
    step, log history) in `trainer_state.json`. Each call writes on the main rank only."""
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    if eval_metrics:
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    trainer.save_state()


def record_artifacts(recipe, adapter: str, out_dir, metrics: dict) -> None:
    """Link the SFT set and the adapter in the W&B run the transformers integration started (main rank), then end
    that run, so the next adapter of `--role all` gets its own run instead of logging into this one."""
    from maps_train import tracking
    from maps_train.recipe import train_sft_dir
    from maps_train.train import sft

    tracker = tracking.active_tracker()
    sft_dir = train_sft_dir(recipe)
    tracker.use_artifact(tracking.artifact_name("sft", sft_dir), "sft", sft_dir)
    metadata = {key: value for key, value in metrics.items() if value}
    tracker.log_artifact(sft.adapter_artifact(recipe.name, adapter), "adapter", out_dir, metadata=metadata)
    tracker.finish_run()


def main(argv: list[str] | None = None) -> int:
    from maps_train.config.redaction import install_log_redaction, redact_text
    from maps_train.recipe import adapter_names, load_recipe
    from maps_train.train import sft
    from maps_train.train.sft import distributed_state

    apply_runtime_defaults()
    install_log_redaction()
    args = parse_args(argv)
    try:
        state = distributed_state()
        logging.basicConfig(
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            level=logging.INFO if state.is_main_process else logging.WARNING,  # one rank narrates
        )
        recipe = load_recipe(args.config, args.overrides)
        adapters = adapter_names(recipe) if args.role == "all" else [args.role]
        for adapter in adapters:
            with sft.sole_trainer(recipe, adapter, state):  # one writer of an adapter's checkpoints
                train_one(recipe, adapter, overwrite=args.overwrite)
                if state.is_main_process:  # the set's manifest, after every adapter (one launch may train one)
                    sft.write_adapter_set(recipe)
    except MapsTrainError as err:
        print(f"maps-train: error: {redact_text(str(err))}", file=sys.stderr)
        return 2
    finally:
        _close_process_group()
    return 0


def _close_process_group() -> None:
    """Leave the gloo/NCCL group cleanly (torch warns at exit otherwise)."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
