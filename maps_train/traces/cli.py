"""`maps-train traces` (teacher runs) and `maps-train sft-data` (per-adapter SFT sets). A teacher's traces are scored
as an eval system's rows by `maps-train score-traces` (`evaluate.trace_scoring`).

With W&B on, each logs what it made as an artifact: the traces (by reference: checksums, not uploads) and the SFT
sets, the second marked as made from the first (`maps_train.tracking`).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from maps_train.preflight_hook import no_plan_option, preflight

# Never part of the traces artifact: run folders, and the SFT sets sft-data writes under the traces by default.
TRACES_SKIPPED = ("wandb", "sft")


def traces_artifact(tracker, recipe, traces_dir: Path, *, use: bool) -> None:
    """Log the traces under `traces_dir` (use=False) or record that this run read them (use=True)."""
    from maps_train.tracking import artifact_name

    name = artifact_name("traces", traces_dir)
    if use:
        tracker.use_artifact(name, "traces", traces_dir, reference=True, skip=TRACES_SKIPPED)
    else:
        tracker.log_artifact(name, "traces", traces_dir, reference=True, skip=TRACES_SKIPPED,
                             metadata={"questions": recipe.traces.questions,
                                       "samples_per_question": recipe.traces.samples_per_question})


def register(app: typer.Typer) -> None:
    @app.command("traces")
    def traces(
        recipe: str = typer.Argument(..., help="Recipe: teacher routes (roles), retrieval, traces.*"),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. traces.limit=100"),
        shard: str = typer.Option(None, "--shard", help="I/N: only shard I of N of the questions, written under "
                                  "<traces.out_dir>/shards/I-of-N (then `maps-train merge-shards`)."),
        no_plan: bool = no_plan_option(),
    ) -> None:
        """Run MAPS with the teacher over traces.questions and record every role call (resumable); with
        traces.samples_per_question > 1, k seeded samples per question at traces.sample_temperature."""
        preflight("traces", recipe, overrides, skip=no_plan)
        from maps_train.config.yaml_io import to_dict
        from maps_train.recipe import load_recipe
        from maps_train.records.shards import Shard
        from maps_train.teachers import Annotations
        from maps_train.traces.collect import collect_traces
        from maps_train.tracking import make_tracker

        loaded = load_recipe(recipe, overrides or [])
        part = Shard.parse(shard)
        teachers = {route.backend for route in loaded.roles.values()}
        annotations = Annotations.from_files(loaded.traces.questions) if "annotation" in teachers else None
        totals = collect_traces(loaded, shard=part, annotations=annotations)
        runs = totals.pop("runs")
        for run in runs:
            typer.echo(f"{run['questions']} questions -> {run['out_dir']}")
        typer.echo("teacher cost: " + json.dumps(totals))
        out_dir = part.out_dir(loaded.traces.out_dir) if part else Path(loaded.traces.out_dir)
        tracker = make_tracker(loaded.wandb, loaded.name, out_dir)
        tracker.start_run(f"{loaded.name}-traces" + (f"-shard-{part.folder}" if part else ""), to_dict(loaded),
                          job_type="traces")
        tracker.log_summary({f"traces/{key}": value for key, value in totals.items()})
        traces_artifact(tracker, loaded, out_dir, use=False)
        tracker.finish_run()

    @app.command("sft-data")
    def sft_data(
        recipe: str = typer.Argument(..., help="Recipe: sft_data.* (traces_dir, out_dir, adapter_roles, filters)"),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. sft_data.skip_bad_lines=true"),
        skip_bad_lines: bool = typer.Option(None, "--skip-bad-lines/--no-skip-bad-lines",
                                            help="Skip malformed trace lines instead of stopping at the first."),
    ) -> None:
        """Turn teacher traces into SFT rows: by sample (sft_data.filter: trace, correct and fully parsed ones)
        or by each call's own credit (filter: role), distinct, at most sft_data.max_samples_per_question a question;
        write one TRL prompt-completion set per adapter (a seeded eval split with sft_data.eval_fraction), with
        per-role counts of kept and rejected rows. Students of one teacher share the set (see sft_data.out_dir)."""
        from maps_train.config.yaml_io import to_dict
        from maps_train.recipe import load_recipe, sft_set_dir, sft_traces_dir
        from maps_train.traces.sft import build_sft_sets
        from maps_train.tracking import artifact_name, make_tracker

        loaded = load_recipe(recipe, overrides or [])
        stats = build_sft_sets(loaded, skip_bad_lines=skip_bad_lines)
        out_dir, traces_dir = sft_set_dir(loaded), sft_traces_dir(loaded)
        typer.echo(stats.table())
        for line in stats.bad_lines[:5]:
            typer.echo(f"skipped: {line}")
        typer.echo(f"wrote {out_dir}/<adapter>/train.jsonl (and eval.jsonl), stats.json, settings.json")
        tracker = make_tracker(loaded.wandb, loaded.name, traces_dir)
        tracker.start_run(f"{loaded.name}-sft-data", to_dict(loaded), job_type="sft-data")
        tracker.log_summary({f"sft/{key}": value for key, value in stats.to_dict().items() if key != "bad_lines"})
        traces_artifact(tracker, loaded, traces_dir, use=True)
        tracker.log_artifact(artifact_name("sft", out_dir), "sft", out_dir)
        tracker.finish_run()
