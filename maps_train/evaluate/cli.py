"""`maps-train eval SUITE.yaml [overrides]` and `maps-train report OUT_DIR`: thin wrappers over run_suite/build_report."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        suite: str = typer.Argument(..., help="A suite YAML, e.g. eval/suites/paper.yaml"),
        overrides: list[str] = typer.Argument(None, help="Dotted suite overrides, e.g. out_dir=runs/x wandb.enabled=true"),
        system: list[str] = typer.Option(None, "--system", "-s", help="Run only this system (repeatable)."),
        dataset: list[str] = typer.Option(None, "--dataset", "-d", help="Run only this data set (repeatable)."),
        sample: int = typer.Option(None, "--sample", "-n", help="Questions per data set (replaces every `sample`)."),
        progress: bool = typer.Option(True, help="Progress bars."),
    ) -> None:
        """Run (or resume) the systems x data sets matrix of a suite, then write its tables and plots."""
        from maps_train.evaluate.suite import run_suite

        outcome = run_suite(
            suite, overrides or [], systems=system or None, datasets=dataset or None, sample_size=sample, progress=progress
        )
        typer.echo(outcome.files.markdown.read_text(encoding="utf-8"))
        typer.echo(f"{outcome.scored} new results; report in {outcome.out_dir}")

    @app.command("report")
    def report_command(out_dir: str = typer.Argument(..., help="A suite's out_dir (holds results.jsonl)")) -> None:
        """Rebuild a suite's Markdown/CSV/JSON tables and PNG plots from its results.jsonl."""
        from maps_train.evaluate.report import build_report

        _, files = build_report(out_dir)
        typer.echo(files.markdown.read_text(encoding="utf-8"))
        typer.echo("wrote " + ", ".join(str(p) for p in files.all()))
