"""`maps-train analyze momentum|drift|stops`: tables (Markdown, CSV) and PNG plots under --out."""

from __future__ import annotations

from pathlib import Path

import typer

from maps_train.errors import MapsTrainError


def _method_inputs(inputs: list[str]) -> list[tuple[str, Path]]:
    """`METHOD=PATH` (or a bare PATH, named after its file) pairs."""
    pairs = []
    for item in inputs:
        method, sep, path = item.partition("=")
        if not sep:
            method, path = Path(item).stem, item
        if not method or not path:
            raise MapsTrainError(f"--input '{item}': want METHOD=PATH")
        pairs.append((method, Path(path)))
    return pairs


def register(app: typer.Typer) -> None:
    analyze_app = typer.Typer(help="Search momentum, drift and stop-round analyses.", no_args_is_help=True)
    app.add_typer(analyze_app, name="analyze")

    @analyze_app.command("momentum")
    def momentum(
        input_path: Path = typer.Argument(..., help="JSONL: {id, question, subqueries} rows or MuSiQue rows"),
        out: Path = typer.Option(Path("runs/analysis/momentum"), help="Output folder"),
        encoder: str = typer.Option("intfloat/e5-base-v2", help="Sentence-transformers model (resolve_model name)"),
        query_prefix: str = typer.Option(None, help="Query prefix; default by model ('query: ' for E5)"),
        m0: str = typer.Option("zero", help="m_0: zero | first-step | question"),
        step_query: str = typer.Option("first", help="Step-t query of a round: first | mean | paths"),
        fit: str = typer.Option("sequential", help="sequential | joint"),
        references: str = typer.Option("keep", help="MuSiQue '#k': keep | answer (gold intermediate answer)"),
        relations: str = typer.Option("keep", help="MuSiQue 'X >> rel': keep | rewrite ('the rel of X')"),
        train_fraction: float = typer.Option(0.5, help="Share of questions in the training split"),
        seed: int = typer.Option(0, help="Split (and path sampling) seed"),
        beta_init: float = typer.Option(0.5, help="Fit start; kept where S_t does not depend on β_t"),
        max_paths: int = typer.Option(64, help="step-query paths: paths sampled per question at most"),
        wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
        wandb_project: str = typer.Option("maps-train", help="W&B project"),
    ) -> None:
        """Fit β_t per step on a train split and report S_t on the held-out split."""
        import json

        from maps_train.analysis.embed import TextEncoder
        from maps_train.analysis.momentum import MomentumOptions, analyze_momentum
        from maps_train.analysis.report import log_to_wandb, plot_momentum, write_table
        from maps_train.analysis.sequences import load_sequences

        sequences = load_sequences(input_path, references=references, relations=relations)
        options = MomentumOptions(m0, step_query, fit, beta_init, train_fraction, seed, max_paths)
        text_encoder = TextEncoder(encoder, query_prefix=query_prefix)
        extra = {"input": str(input_path), "references": references, "relations": relations}
        table = analyze_momentum(sequences, text_encoder, options, extra)
        out.mkdir(parents=True, exist_ok=True)
        rows = table.to_dict()["steps"]
        paths = write_table(out, "momentum", rows, table.to_markdown())
        (out / "momentum.json").write_text(json.dumps(table.to_dict(), indent=2) + "\n", encoding="utf-8")
        plot = plot_momentum(table, out / "momentum.png")
        typer.echo(table.to_markdown())
        typer.echo("wrote " + ", ".join(str(p) for p in [*paths, out / "momentum.json", plot]))
        if wandb_log:
            log_to_wandb("analyze-momentum", {"momentum": rows}, {"momentum_plot": plot}, wandb_project, out)

    @analyze_app.command("drift")
    def drift(
        inputs: list[str] = typer.Option(..., "--input", help="METHOD=PATH of sub-query JSONL (repeatable)"),
        out: Path = typer.Option(Path("runs/analysis/drift"), help="Output folder"),
        encoder: str = typer.Option("intfloat/e5-base-v2", help="Sentence-transformers model"),
        betas: Path = typer.Option(None, help="momentum.json whose fitted β_t to use"),
        beta: float = typer.Option(0.5, help="Constant β when --betas is not given"),
        m0: str = typer.Option("zero", help="m_0: zero | first-step | question"),
        step_query: str = typer.Option("mean", help="Step-t query of a round: first | mean"),
        references: str = typer.Option("keep", help="MuSiQue '#k': keep | answer"),
        relations: str = typer.Option("keep", help="MuSiQue 'X >> rel': keep | rewrite"),
        wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
        wandb_project: str = typer.Option("maps-train", help="W&B project"),
    ) -> None:
        """Per round and method: drift from the question, momentum turn, similarity to gold evidence."""
        from maps_train.analysis.drift import drift_curves, drift_markdown, drift_rows, load_betas
        from maps_train.analysis.embed import TextEncoder, embed_evidence, embed_sequences
        from maps_train.analysis.report import log_to_wandb, plot_drift, write_table
        from maps_train.analysis.sequences import load_sequences

        text_encoder = TextEncoder(encoder)
        beta_values = load_betas(betas) if betas else beta
        curves = []
        for method, path in _method_inputs(inputs):
            sequences = [s for s in load_sequences(path, references, relations) if s.rounds]
            questions, rounds = embed_sequences(sequences, text_encoder)
            evidence = embed_evidence(sequences, text_encoder)
            curves += drift_curves(method, questions, rounds, evidence, beta_values, m0, step_query)
        rows = drift_rows(curves)
        paths = write_table(out, "drift", rows, drift_markdown(curves))
        plot = plot_drift(curves, out / "drift.png")
        typer.echo(drift_markdown(curves))
        typer.echo("wrote " + ", ".join(str(p) for p in [*paths, plot]))
        if wandb_log:
            log_to_wandb("analyze-drift", {"drift": rows}, {"drift_plot": plot}, wandb_project, out)

    @analyze_app.command("stops")
    def stops(
        inputs: list[str] = typer.Option(..., "--input", help="METHOD=PATH of answer JSONL with 'rounds' (repeatable)"),
        out: Path = typer.Option(Path("runs/analysis/stops"), help="Output folder"),
        wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
        wandb_project: str = typer.Option("maps-train", help="W&B project"),
    ) -> None:
        """Share of questions stopping at round 1 and at round 5 or later, per method."""
        from dataclasses import asdict

        from maps_train.analysis.report import log_to_wandb, plot_stops, write_table
        from maps_train.analysis.stops import load_stop_rounds, stop_stats, stops_markdown

        by_method: dict[str, list[int]] = {}
        for method, path in _method_inputs(inputs):
            for record_method, rounds in load_stop_rounds(path):
                by_method.setdefault(record_method or method, []).append(rounds)
        stats = [stop_stats(method, rounds) for method, rounds in by_method.items()]
        rows = [{k: v for k, v in asdict(s).items() if k != "histogram"} for s in stats]
        paths = write_table(out, "stops", rows, stops_markdown(stats))
        plot = plot_stops(stats, out / "stops.png")
        typer.echo(stops_markdown(stats))
        typer.echo("wrote " + ", ".join(str(p) for p in [*paths, plot]))
        if wandb_log:
            log_to_wandb("analyze-stops", {"stops": rows}, {"stops_plot": plot}, wandb_project, out)
