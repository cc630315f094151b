"""`maps-train traces` (teacher runs) and `maps-train sft-data` (per-adapter SFT sets)."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("traces")
    def traces(
        recipe: str = typer.Argument(..., help="Recipe: teacher routes (roles), retrieval, traces.*"),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. traces.limit=100"),
    ) -> None:
        """Run MAPS with the teacher over traces.questions and record every role call (resumable); with
        traces.samples_per_question > 1, k seeded samples per question at traces.sample_temperature."""
        from maps_train.config import to_dict
        from maps_train.recipe import load_recipe
        from maps_train.traces.collect import collect_traces
        from maps_train.tracking import make_tracker

        loaded = load_recipe(recipe, overrides or [])
        totals = collect_traces(loaded)
        runs = totals.pop("runs")
        for run in runs:
            typer.echo(f"{run['questions']} questions -> {run['out_dir']}")
        typer.echo("teacher cost: " + json.dumps(totals))
        tracker = make_tracker(loaded.wandb, loaded.name, loaded.traces.out_dir)
        tracker.start_run(f"{loaded.name}-traces", to_dict(loaded), job_type="traces")
        tracker.log_summary({f"traces/{key}": value for key, value in totals.items()})
        tracker.finish_run()

    @app.command("sft-data")
    def sft_data(
        recipe: str = typer.Argument(..., help="Recipe: sft_data.* (traces_dir, out_dir, adapter_roles, filters)"),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. sft_data.skip_bad_lines=true"),
        skip_bad_lines: bool = typer.Option(None, "--skip-bad-lines/--no-skip-bad-lines",
                                            help="Skip malformed trace lines instead of stopping at the first."),
    ) -> None:
        """Keep correct, fully parsed, distinct samples (at most sft_data.max_samples_per_question per question);
        write one TRL prompt-completion set per adapter, with per-role counts of kept and rejected rows."""
        from maps_train.recipe import load_recipe
        from maps_train.traces.sft import build_sft_sets

        loaded = load_recipe(recipe, overrides or [])
        stats = build_sft_sets(loaded, skip_bad_lines=skip_bad_lines)
        typer.echo(stats.table())
        for line in stats.bad_lines[:5]:
            typer.echo(f"skipped: {line}")
        typer.echo(f"wrote {loaded.sft_data.out_dir}/<adapter>/train.jsonl and stats.json")
