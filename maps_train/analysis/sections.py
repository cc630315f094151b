"""The analyses over several methods at once, each computed and written as tables (Markdown, CSV) + a PNG.

- Table 1 as the paper builds it (`run_table1`): β_t and S_t per data set (2WikiMultihopQA, MuSiQue, HotpotQA)
  on Search-o1's sub-queries, with the paper's settings (`paper_momentum_options`) whatever the CLI options say;
- momentum, this project's own view: β_t and S_t per method over all its data sets, plus one fit pooled over
  every method and data set ("all (pooled)"), whose β the drift analysis uses so that every method's drift is
  measured under the same β (the paper gives no β for drift: this is our choice, and said so under the table);
- drift (3.3): the paper's seeded 500-question sample across every data set, the same questions for every method;
- stops (3.4): shares of questions stopping at retrieval round 1 and needing 5 or more, per method.
A method whose sequences cannot be fitted (no question with two searched rounds, e.g. vanilla RAG) is listed
with the reason instead of failing the whole analysis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.analysis.drift import DRIFT_QUESTIONS, DriftRound, drift_curves, drift_markdown, drift_rows, sample_keys
from maps_train.analysis.momentum import MomentumOptions, MomentumTable, analyze_momentum
from maps_train.analysis.report import plot_drift, plot_momentum, plot_momentum_methods, plot_stops, write_table
from maps_train.analysis.sequences import SubquerySequence
from maps_train.analysis.stops import StopRound, StopStats, stop_stats, stops_markdown, stops_rows
from maps_train.errors import MapsTrainError

POOLED = "all (pooled)"


@dataclass
class Written:
    """What one analysis wrote: its table rows (for W&B), the files, and its plot."""

    name: str
    rows: list[dict[str, Any]]
    markdown: str
    files: list[Path]
    plot: Path


# -- momentum ------------------------------------------------------------------------------------------------------


@dataclass
class MomentumResult:
    tables: dict[str, MomentumTable] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it has no table

    @property
    def pooled(self) -> MomentumTable | None:
        return self.tables.get(POOLED)


def fit_momentum(
    sequences: list[SubquerySequence], encoder, options: MomentumOptions, extra: dict[str, Any] | None = None
) -> MomentumTable | str:
    """The momentum table of one group of sequences, or why it has none (a small group is reported, not fatal)."""
    usable = [s for s in sequences if s.rounds]
    multi = sum(1 for s in usable if len(s.rounds) >= 2)
    if multi < 2:
        return f"{multi} question(s) with 2 or more searched rounds (S_t needs q_(t+1))"
    try:
        return analyze_momentum(usable, encoder, options, extra)
    except MapsTrainError as err:
        return str(err)


def run_momentum(
    by_method: dict[str, list[SubquerySequence]], encoder, options: MomentumOptions, extra: dict[str, Any] | None = None
) -> MomentumResult:
    """One table per method, and (with more than one method) the pooled fit."""
    result = MomentumResult()
    groups = dict(by_method)
    if len(by_method) > 1:
        groups[POOLED] = [s for sequences in by_method.values() for s in sequences]
    for method, sequences in groups.items():
        fitted = fit_momentum(sequences, encoder, options, extra)
        if isinstance(fitted, str):
            result.skipped[method] = fitted
        else:
            result.tables[method] = fitted
    return result


def momentum_rows(result: MomentumResult) -> list[dict[str, Any]]:
    rows = []
    for method, table in result.tables.items():
        rows += [{"method": method, **row} for row in table.to_dict()["steps"]]
    return rows


def momentum_markdown(result: MomentumResult) -> str:
    lines = [
        "| method | step t | β_t | n train | n held-out | S_t train | S_t held-out | S_t held-out, β=0 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    options: dict[str, Any] = {}
    for method, table in result.tables.items():
        options = table.options
        for s in table.steps:
            beta = f"{s.beta:.4f}" + ("" if s.identified else " (not identified)")
            lines.append(
                f"| {method} | {s.step} | {beta} | {s.n_train} | {s.n_test} | {s.s_train:.3f} | {s.s_test:.3f} "
                f"| {s.s_test_no_momentum:.3f} |"
            )
    pooled = POOLED in result.tables or POOLED in result.skipped
    lines += [
        "",
        "One fit per method over every data set it ran on" + (f", and '{POOLED}' over every method" if pooled else "")
        + ": this project's own views. The paper's Table 1 fits each data set apart, on Search-o1's sub-queries "
        "(`maps-train analyze suite` writes it as table1/).",
    ]
    fixed = options.get("beta_init", 0.0)
    lines.append(
        f"A β_t marked 'not identified' does not change S_t; it is fixed at beta_init = {fixed}"
        + (" (m_1 = q_1 - q_0, as the paper prints β_1)." if fixed == 0 else ".")
        + " The later β_t depend on this convention."
    )
    for method, why in result.skipped.items():
        lines.append(f"- {method}: no fit ({why}).")
    if options:
        lines += ["", "Options: " + ", ".join(f"{k}={v}" for k, v in options.items())]
    return "\n".join(lines) + "\n"


def write_momentum(out: Path, result: MomentumResult) -> Written:
    """One method: its table as `MomentumTable` writes it (momentum.json = that table, as before); several: one
    table with a method column, momentum.json = {methods, pooled, skipped}."""
    out.mkdir(parents=True, exist_ok=True)
    if len(result.tables) == 1 and not result.skipped:
        table = next(iter(result.tables.values()))
        rows, markdown = table.to_dict()["steps"], table.to_markdown()
        data: dict[str, Any] = table.to_dict()
        plot = plot_momentum(table, out / "momentum.png")
    else:  # several methods, or none fitted (a small run: the table lists why, so a suite analysis still completes)
        rows, markdown = momentum_rows(result), momentum_markdown(result)
        data = {
            "methods": {m: t.to_dict() for m, t in result.tables.items() if m != POOLED},
            "skipped": result.skipped,
        }
        if result.pooled is not None:
            data["pooled"] = result.pooled.to_dict()
        plot = plot_momentum_methods(result.tables, out / "momentum.png")
    files = write_table(out, "momentum", rows, markdown)
    (out / "momentum.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return Written("momentum", rows, markdown, [*files, out / "momentum.json"], plot)


def drift_betas(result: MomentumResult | None) -> tuple[list[float], str]:
    """The β the drift uses: the pooled fit (one method: its own), else β = 0; with a sentence saying which."""
    if result is not None:
        table = result.pooled or (next(iter(result.tables.values())) if len(result.tables) == 1 else None)
        if table is not None:
            betas = [s.beta for s in table.steps]
            which = ("pooled over every method and data set (this project's choice: the paper names no β for 3.3)"
                     if table is result.pooled else "of the one method")
            listed = ", ".join(f"{b:.4f}" for b in betas)
            return betas, f"β_t from the momentum fit {which}: {listed} (later rounds reuse the last β)."
    return [0.0], "β = 0 (no momentum fit available): m_t = q_t - q_(t-1)."


# -- Table 1 as the paper builds it ---------------------------------------------------------------------------------

TABLE1_METHOD = "search_o1"  # the paper fits momentum on Search-o1's reasoning-while-retrieving sub-queries
TABLE1_DATASETS = {"2wikimultihopqa": "2WikiMultihopQA", "musique": "MuSiQue", "hotpotqa": "HotpotQA"}  # its order


def paper_momentum_options(seed: int = 0) -> MomentumOptions:
    """Table 1's settings, fixed whatever the CLI's momentum options: m_0 = 0 and β_1 = 0 (m_1 = q_1 - q_0, the
    paper's convention), q_t the turn's one query, β_t fitted step by step on a seeded half of the questions."""
    return MomentumOptions(m0="zero", step_query="first", fit="sequential", beta_init=0.0, train_fraction=0.5,
                           seed=seed)


@dataclass
class Table1:
    """Table 1 per (data set, system): a system is one Search-o1 run of the suite (e.g. a thinking variant)."""

    tables: dict[tuple[str, str], MomentumTable] = field(default_factory=dict)
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)  # (data set, system) -> why no table
    missing: list[str] = field(default_factory=list)  # the paper's data sets no Search-o1 run covers
    seed: int = 0


def run_table1(
    runs: dict[tuple[str, str], list[SubquerySequence]], encoder, seed: int = 0, extra: dict[str, Any] | None = None
) -> Table1:
    """One fit per paper data set and Search-o1 system; `runs` maps (data set, system) to that run's sequences
    (other data sets are left out: the paper's Table 1 has these three)."""
    result = Table1(seed=seed)
    options = paper_momentum_options(seed)
    for dataset in TABLE1_DATASETS:
        systems = sorted(system for d, system in runs if d == dataset)
        if not systems:
            result.missing.append(dataset)
        for system in systems:
            fitted = fit_momentum(runs[(dataset, system)], encoder, options, extra)
            if isinstance(fitted, str):
                result.skipped[(dataset, system)] = fitted
            else:
                result.tables[(dataset, system)] = fitted
    return result


def table1_rows(result: Table1) -> list[dict[str, Any]]:
    return [{"dataset": dataset, "system": system, **row}
            for (dataset, system), table in result.tables.items() for row in table.to_dict()["steps"]]


def table1_markdown(result: Table1) -> str:
    lines = [
        "| data set | system | step t | β_t | n train | n held-out | S_t train | S_t held-out | S_t held-out, β=0 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (dataset, system), table in result.tables.items():
        for s in table.steps:
            beta = f"{s.beta:.4f}" + ("" if s.identified else " (convention)" if s.step == 1 else " (not identified)")
            lines.append(
                f"| {TABLE1_DATASETS[dataset]} | {system} | {s.step} | {beta} | {s.n_train} | {s.n_test} "
                f"| {s.s_train:.3f} | {s.s_test:.3f} | {s.s_test_no_momentum:.3f} |"
            )
    encoder = next((t.options.get("encoder") for t in result.tables.values()), None)
    lines += [
        "",
        "Search-o1's reasoning-while-retrieving sub-queries (one per searching turn), one fit per data set and "
        "system, as the paper builds Table 1: q_0 the question, q_t the step-t query"
        + (f" ({encoder})" if encoder else "") + ", m_0 = 0, m_t = β_t m_(t-1) + (1-β_t)(q_t - q_(t-1)), "
        "S_t = cos(m_t, q_(t+1) - q_0); β_t fitted step by step (L-BFGS-B, [0, 1]) to maximise mean S_t on a "
        f"seeded half of the questions (seed {result.seed}), S_t reported on the other half.",
        "β_1 convention: S_1 does not depend on β_1, so β_1 = 0 (m_1 = q_1 - q_0), as the paper prints it; the "
        "later β_t are comparable only under this convention.",
    ]
    for (dataset, system), why in result.skipped.items():
        lines.append(f"- {TABLE1_DATASETS[dataset]} / {system}: no fit ({why}).")
    if result.missing:
        lines.append("- No Search-o1 run on " + ", ".join(TABLE1_DATASETS[d] for d in result.missing) + ".")
    return "\n".join(lines) + "\n"


def write_table1(out: Path, result: Table1) -> Written:
    out.mkdir(parents=True, exist_ok=True)
    rows, markdown = table1_rows(result), table1_markdown(result)
    files = write_table(out, "table1", rows, markdown)
    data = {
        "tables": {f"{dataset}/{system}": t.to_dict() for (dataset, system), t in result.tables.items()},
        "skipped": {f"{dataset}/{system}": why for (dataset, system), why in result.skipped.items()},
        "missing": result.missing,
    }
    (out / "table1.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    labelled = {f"{TABLE1_DATASETS[d]} / {system}": t for (d, system), t in result.tables.items()}
    plot = plot_momentum_methods(labelled, out / "table1.png")
    return Written("table1", rows, markdown, [*files, out / "table1.json"], plot)


# -- drift ---------------------------------------------------------------------------------------------------------


def _key(sequence: SubquerySequence) -> tuple[str, str]:
    return (sequence.dataset, sequence.id)


def run_drift(
    by_method: dict[str, list[SubquerySequence]],
    encoder,
    betas: list[float] | float,
    m0: str = "zero",
    step_query: str = "mean",
    questions: int | None = DRIFT_QUESTIONS,
    seed: int = 0,
) -> tuple[list[DriftRound], str]:
    """Drift curves per method on one seeded sample of questions drawn across every data set (the same for all)."""
    from maps_train.analysis.embed import embed_evidence, embed_sequences

    keys = sample_keys((_key(s) for sequences in by_method.values() for s in sequences), questions, seed)
    curves: list[DriftRound] = []
    absent = []
    for method, sequences in by_method.items():
        chosen = [s for s in sequences if _key(s) in keys and s.rounds]
        if not chosen:
            absent.append(method)
            continue
        vectors, rounds = embed_sequences(chosen, encoder)
        curves += drift_curves(method, vectors, rounds, embed_evidence(chosen, encoder), betas, m0, step_query)
    datasets = sorted({d for d, _ in keys if d})
    note = (
        f"{len(keys)} questions drawn at random (seed {seed}) across "
        + (f"{len(datasets)} data sets ({', '.join(datasets)})" if datasets else "the input")
        + "; a method contributes those it searched for. q_t is the "
        + ("mean of the round's sub-queries" if step_query == "mean" else "round's first sub-query")
        + f", m_0 = {m0}."
    )
    if absent:
        note += f" No searched sub-query of their own on these questions: {', '.join(absent)}."
    return curves, note


def write_drift(out: Path, curves: list[DriftRound], note: str) -> Written:
    rows, markdown = drift_rows(curves), drift_markdown(curves, note)
    files = write_table(out, "drift", rows, markdown)
    return Written("drift", rows, markdown, files, plot_drift(curves, out / "drift.png"))


# -- stops ---------------------------------------------------------------------------------------------------------


def run_stops(by_method: dict[str, list[StopRound]]) -> list[StopStats]:
    return [stop_stats(method, rounds) for method, rounds in by_method.items() if rounds]


def write_stops(out: Path, stats: list[StopStats]) -> Written:
    rows, markdown = stops_rows(stats), stops_markdown(stats)
    files = write_table(out, "stops", rows, markdown)
    return Written("stops", rows, markdown, files, plot_stops(stats, out / "stops.png"))


__all__ = [
    "POOLED", "TABLE1_DATASETS", "TABLE1_METHOD", "MomentumResult", "Table1", "Written", "drift_betas",
    "fit_momentum", "momentum_markdown", "momentum_rows", "paper_momentum_options", "run_drift", "run_momentum",
    "run_stops", "run_table1", "table1_markdown", "write_drift", "write_momentum", "write_stops", "write_table1",
]
