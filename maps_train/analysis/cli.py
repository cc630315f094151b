"""`maps-train analyze momentum|drift|stops|suite|credit|queries`: tables (Markdown, CSV) and PNG plots under --out.

Every command takes INPUTs: an eval suite's output folder, a system's or a run's folder, a run's traces/answers
file, or a JSONL file (sub-query rows, MuSiQue rows, answer records); `--input METHOD=PATH` names one.
"""

from __future__ import annotations

from pathlib import Path

import typer

# Shared option defaults (typer reads them at registration).
_INPUTS_HELP = "Suite output folder, run folder, traces/answers file, or JSONL (repeatable; METHOD=PATH names one)"


def _sources(inputs: list[str] | None, named: list[str] | None):
    from maps_train.analysis.inputs import parse_sources

    return parse_sources([*(inputs or []), *(named or [])])


def _index(questions: list[Path] | None, data_root: Path | None, corpus: Path | None):
    from maps_train.analysis.runs import QuestionIndex

    return QuestionIndex(questions or [], data_root, corpus)


def _echo(written) -> None:
    typer.echo(written.markdown)
    typer.echo("wrote " + ", ".join(str(p) for p in [*written.files, written.plot]))


def _wandb(name: str, written_list, project: str, out: Path) -> None:
    from maps_train.analysis.report import log_to_wandb

    log_to_wandb(name, {w.name: w.rows for w in written_list}, {f"{w.name}_plot": w.plot for w in written_list},
                 project, out)


def _questions_opt():
    return typer.Option(None, "--questions", help="Question JSONL with metadata, for gold evidence (repeatable)")


def _data_root_opt():
    return typer.Option(None, "--data-root", help="Look the suite's data sets up under this data_root instead")


def _corpus_opt():
    return typer.Option(None, "--corpus", help="Corpus JSONL, for gold passages named only by corpus id (demo world)")


def _question_searches_opt():
    return typer.Option(
        False, "--include-question-searches", help="Keep searches with the question text itself (vanilla, s3's first)"
    )


def momentum_command(
    inputs: list[str] = typer.Argument(None, help=_INPUTS_HELP),
    named: list[str] = typer.Option(None, "--input", help="METHOD=PATH (repeatable)"),
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
    beta_init: float = typer.Option(
        0.0, help="Value of a β_t that S_t does not depend on (β_1 under m0 zero/first-step); 0: m_1 = q_1 - q_0"
    ),
    max_paths: int = typer.Option(64, help="step-query paths: paths sampled per question at most"),
    questions: list[Path] = _questions_opt(),
    data_root: Path = _data_root_opt(),
    corpus: Path = _corpus_opt(),
    include_question_searches: bool = _question_searches_opt(),
    wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
    wandb_project: str = typer.Option("maps-train", help="W&B project"),
) -> None:
    """Fit β_t per step on a train split and report S_t on the held-out split, per method (and pooled)."""
    from maps_train.analysis.embed import TextEncoder
    from maps_train.analysis.inputs import sequences_by_method
    from maps_train.analysis.momentum import MomentumOptions
    from maps_train.analysis.sections import run_momentum, write_momentum

    sources = _sources(inputs, named)
    by_method = sequences_by_method(
        sources, _index(questions, data_root, corpus), references, relations, include_question_searches
    )
    options = MomentumOptions(m0, step_query, fit, beta_init, train_fraction, seed, max_paths)
    text_encoder = TextEncoder(encoder, query_prefix=query_prefix)
    extra = {"input": ", ".join(str(p) for _, p in sources), "references": references, "relations": relations}
    written = write_momentum(out, run_momentum(by_method, text_encoder, options, extra))
    _echo(written)
    if wandb_log:
        _wandb("analyze-momentum", [written], wandb_project, out)


def drift_command(
    inputs: list[str] = typer.Argument(None, help=_INPUTS_HELP),
    named: list[str] = typer.Option(None, "--input", help="METHOD=PATH (repeatable)"),
    out: Path = typer.Option(Path("runs/analysis/drift"), help="Output folder"),
    encoder: str = typer.Option("intfloat/e5-base-v2", help="Sentence-transformers model"),
    betas: Path = typer.Option(None, help="momentum.json whose fitted β_t to use (its pooled fit if it has one)"),
    beta: float = typer.Option(None, help="A constant β instead (default: fit β on the inputs, pooled)"),
    m0: str = typer.Option("zero", help="m_0: zero | first-step | question"),
    step_query: str = typer.Option("mean", help="Step-t query of a round: first | mean"),
    sample: int = typer.Option(500, help="Questions drawn at random across every data set (0: all)"),
    seed: int = typer.Option(0, help="Sampling seed"),
    references: str = typer.Option("keep", help="MuSiQue '#k': keep | answer"),
    relations: str = typer.Option("keep", help="MuSiQue 'X >> rel': keep | rewrite"),
    questions: list[Path] = _questions_opt(),
    data_root: Path = _data_root_opt(),
    corpus: Path = _corpus_opt(),
    include_question_searches: bool = _question_searches_opt(),
    wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
    wandb_project: str = typer.Option("maps-train", help="W&B project"),
) -> None:
    """Per round and method: accumulated change of cos(m_t, q_0), similarity to gold evidence (paper 3.3)."""
    from maps_train.analysis.drift import load_betas
    from maps_train.analysis.embed import TextEncoder
    from maps_train.analysis.inputs import sequences_by_method
    from maps_train.analysis.momentum import MomentumOptions
    from maps_train.analysis.sections import drift_betas, run_drift, run_momentum, write_drift

    by_method = sequences_by_method(
        _sources(inputs, named), _index(questions, data_root, corpus), references, relations,
        include_question_searches,
    )
    text_encoder = TextEncoder(encoder)
    if betas is not None:
        beta_values = load_betas(betas)
        beta_note = f"β_t from {betas}: " + ", ".join(f"{b:.4f}" for b in beta_values) + "."
    elif beta is not None:
        beta_values, beta_note = [beta], f"β = {beta} for every round."
    else:
        beta_values, beta_note = drift_betas(run_momentum(by_method, text_encoder, MomentumOptions(m0=m0)))
    curves, note = run_drift(by_method, text_encoder, beta_values, m0, step_query, sample or None, seed)
    written = write_drift(out, curves, f"{note} {beta_note}")
    _echo(written)
    if wandb_log:
        _wandb("analyze-drift", [written], wandb_project, out)


def stops_command(
    inputs: list[str] = typer.Argument(None, help=_INPUTS_HELP),
    named: list[str] = typer.Option(None, "--input", help="METHOD=PATH of answer records (repeatable)"),
    out: Path = typer.Option(Path("runs/analysis/stops"), help="Output folder"),
    wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
    wandb_project: str = typer.Option("maps-train", help="W&B project"),
) -> None:
    """Share of questions stopping at retrieval round 1 and needing 5 or more, per method (paper 3.4)."""
    from maps_train.analysis.inputs import stop_rounds_by_method
    from maps_train.analysis.sections import run_stops, write_stops

    written = write_stops(out, run_stops(stop_rounds_by_method(_sources(inputs, named))))
    _echo(written)
    if wandb_log:
        _wandb("analyze-stops", [written], wandb_project, out)


def suite_command(
    runs_dir: Path = typer.Argument(..., help="An eval suite's output folder (or one system's / run's folder)"),
    out: Path = typer.Option(None, help="Output folder (default: <RUNS_DIR>/analysis)"),
    encoder: str = typer.Option("intfloat/e5-base-v2", help="Sentence-transformers model"),
    step_query: str = typer.Option("first", help="Momentum: step-t query of a round: first | mean | paths"),
    beta_init: float = typer.Option(0.0, help="Value of an unidentified β_t (β_1); 0: m_1 = q_1 - q_0"),
    seed: int = typer.Option(0, help="Momentum split seed"),
    drift_sample: int = typer.Option(500, help="Drift: questions drawn across every data set (0: all)"),
    drift_seed: int = typer.Option(0, help="Drift: sampling seed"),
    drift_beta: float = typer.Option(None, help="Drift: a constant β (default: the pooled momentum fit)"),
    questions: list[Path] = _questions_opt(),
    data_root: Path = _data_root_opt(),
    corpus: Path = _corpus_opt(),
    include_question_searches: bool = _question_searches_opt(),
    wandb_log: bool = typer.Option(False, "--wandb", help="Log tables and plots to W&B"),
    wandb_project: str = typer.Option("maps-train-analysis", help="W&B project"),
) -> None:
    """Momentum, drift and stop rounds for every system of an eval suite output, in one command."""
    from maps_train.analysis.momentum import MomentumOptions
    from maps_train.analysis.suite import SuiteAnalysisOptions, analyze_suite

    options = SuiteAnalysisOptions(
        encoder=encoder,
        momentum=MomentumOptions(step_query=step_query, beta_init=beta_init, seed=seed),
        drift_questions=drift_sample or None,
        drift_seed=drift_seed,
        drift_beta=drift_beta,
        include_question_searches=include_question_searches,
        questions=list(questions or []),
        data_root=data_root,
        corpus=corpus,
    )
    result = analyze_suite(runs_dir, out, options, wandb_project=wandb_project if wandb_log else None)
    typer.echo(result.page.read_text(encoding="utf-8"))
    typer.echo(f"wrote {result.page} and, under {result.out_dir}: "
               + ", ".join(str(p.relative_to(result.out_dir)) for s in result.sections for p in [*s.files, s.plot]))


def credit_command(
    traces: list[Path] = typer.Argument(..., help="Traces files (traces.jsonl of a run, a sample or an eval run)"),
    out: Path = typer.Option(None, help="Also write the Markdown table here"),
) -> None:
    """Credit per role from traces: new gold found by the writer and proposer, right stop-or-continue decisions of
    the consolidator, EM and F1 of the answer (maps_train/records/credit.py)."""
    from maps_train.analysis.credit import credit_markdown, credit_summary

    table = credit_markdown((str(path), credit_summary(path)) for path in traces)
    typer.echo(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n", encoding="utf-8")


def queries_command(
    runs: list[Path] = typer.Argument(..., help="Traces files, or folders holding them (an eval system's run folder)"),
    against: Path = typer.Option(None, help="A reference run on the same questions (Vanilla RAG's traces or folder)"),
    out: Path = typer.Option(None, help="Also write the Markdown tables here"),
) -> None:
    """Sub-queries against the question's own search: searches, directions per round, question echoes, evidence
    recall; with --against, the gold passages only the run or only the reference found (maps_train/analysis/
    queries.py)."""
    from maps_train.analysis.queries import against_summary, queries_markdown, read_searches, run_summary

    searched = [(str(path), *read_searches(path)) for path in runs]
    reference = read_searches(against)[0] if against is not None else None
    table = queries_markdown(
        [(name, run_summary(searches, uncredited)) for name, searches, uncredited in searched],
        [(name, str(against), against_summary(searches, reference)) for name, searches, _ in searched]
        if reference is not None else None)
    typer.echo(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n", encoding="utf-8")


def register(app: typer.Typer) -> None:
    analyze_app = typer.Typer(help="Analyses of runs and traces: momentum, drift, stop rounds, credit per role, sub-queries.", no_args_is_help=True)
    app.add_typer(analyze_app, name="analyze")
    analyze_app.command("momentum")(momentum_command)
    analyze_app.command("drift")(drift_command)
    analyze_app.command("stops")(stops_command)
    analyze_app.command("suite")(suite_command)
    analyze_app.command("credit")(credit_command)
    analyze_app.command("queries")(queries_command)
