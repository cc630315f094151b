"""`maps-train analyze suite RUNS_DIR`: momentum, drift and stop rounds for every system of an eval suite's output.

One command after `maps-train eval eval/suites/paper.yaml` gives the paper's Table 1, the 3.3 drift curves and
the 3.4 stop-round shares, from the runs' own traces and answer records:

    <out>/table1/{table1.md, .csv, .json, .png}       the paper's Table 1: per data set (2Wiki, MuSiQue, HotpotQA),
                                                       on each Search-o1 run, with the paper's settings (β_1 = 0);
                                                       written when the input holds such a run (found by the
                                                       traces' `method`, whatever the system is named)
    <out>/momentum/{momentum.md, .csv, .json, .png}   this project's views: β_t and S_t per system over all its
                                                       data sets, and pooled over every system and data set
    <out>/drift/{drift.md, .csv, .png}                 500 seeded questions across the data sets, β of the pooled fit
    <out>/stops/{stops.md, .csv, .png}                 retrieval rounds executed per question
    <out>/evidence/{evidence.md, .csv, .png}           evidence recall after each retrieval round (gold passages)
    <out>/analysis.md                                  the three tables in one page
and, with W&B on, one run holding the tables and plots.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from maps_train.analysis.drift import DRIFT_QUESTIONS
from maps_train.analysis.embed import DEFAULT_ENCODER, TextEncoder
from maps_train.analysis.evidence_by_round import evidence_by_round, write_evidence
from maps_train.analysis.inputs import sequences_by_method, stop_rounds_by_method
from maps_train.analysis.momentum import MomentumOptions
from maps_train.analysis.report import log_to_wandb
from maps_train.analysis.runs import QuestionIndex, RunFolder, find_runs
from maps_train.analysis.sections import (
    TABLE1_DATASETS,
    TABLE1_METHOD,
    Written,
    drift_betas,
    run_drift,
    run_momentum,
    run_stops,
    run_table1,
    write_drift,
    write_momentum,
    write_stops,
    write_table1,
)
from maps_train.analysis.sequences import SubquerySequence
from maps_train.records.trace import iter_traces

TABLE1_TITLE = "Table 1: search momentum per data set, on Search-o1 (as the paper builds it)"


@dataclass
class SuiteAnalysisOptions:
    encoder: str = DEFAULT_ENCODER
    momentum: MomentumOptions = field(default_factory=MomentumOptions)
    drift_questions: int | None = DRIFT_QUESTIONS
    drift_seed: int = 0
    drift_beta: float | None = None  # None: the β of the pooled momentum fit
    drift_step_query: str = "mean"
    include_question_searches: bool = False  # vanilla's / s3's search with the question text itself
    questions: list[Path] = field(default_factory=list)  # question files with metadata (else the suite's data sets)
    data_root: Path | None = None  # replaces the suite's data_root when looking questions up
    corpus: Path | None = None  # passages for metadata that names gold passages by corpus id only


@dataclass
class SuiteAnalysis:
    out_dir: Path
    sections: list[Written]
    page: Path


def run_method(run: RunFolder) -> str | None:
    """The method a run folder ran (its first trace's `method`): a system's name need not say it."""
    if not run.traces.is_file():
        return None
    for _, record in iter_traces(run.traces):
        return None if isinstance(record, Exception) else record.method
    return None


def table1_runs(
    runs: list[RunFolder], sequences: dict[str, list[SubquerySequence]]
) -> dict[tuple[str, str], list[SubquerySequence]]:
    """(data set, system) -> sequences, for the Search-o1 runs on Table 1's data sets."""
    chosen = {}
    for run in runs:
        if run.dataset in TABLE1_DATASETS and run_method(run) == TABLE1_METHOD:
            chosen[(run.dataset, run.system)] = [s for s in sequences.get(run.system, []) if s.dataset == run.dataset]
    return chosen


def analyze_suite(
    runs_dir: str | Path,
    out_dir: str | Path | None = None,
    options: SuiteAnalysisOptions | None = None,
    encoder: TextEncoder | None = None,
    wandb_project: str | None = None,
    tracker=None,
) -> SuiteAnalysis:
    """The three analyses for every system under `runs_dir`; files under `out_dir` (default `<runs_dir>/analysis`)."""
    options = options or SuiteAnalysisOptions()
    runs_dir = Path(runs_dir)
    out = Path(out_dir) if out_dir else runs_dir / "analysis"
    runs = find_runs(runs_dir)  # fail at once, naming the folder, when there is nothing to analyse
    encoder = encoder or TextEncoder(options.encoder)
    index = QuestionIndex(options.questions, options.data_root, options.corpus)

    sequences = sequences_by_method([(None, runs_dir)], index, include_question_searches=options.include_question_searches)
    extra = {"input": str(runs_dir), "include_question_searches": options.include_question_searches}
    sections = []
    paper_runs = table1_runs(runs, sequences)
    if paper_runs:
        sections.append(write_table1(out / "table1", run_table1(paper_runs, encoder, options.momentum.seed, extra)))
    momentum = run_momentum(sequences, encoder, options.momentum, extra)
    sections.append(write_momentum(out / "momentum", momentum))

    if options.drift_beta is not None:
        betas, beta_note = [options.drift_beta], f"β = {options.drift_beta} for every round."
    else:
        betas, beta_note = drift_betas(momentum)
    curves, note = run_drift(
        sequences, encoder, betas, options.momentum.m0, options.drift_step_query, options.drift_questions,
        options.drift_seed,
    )
    sections.append(write_drift(out / "drift", curves, f"{note} {beta_note}"))
    sections.append(write_stops(out / "stops", run_stops(stop_rounds_by_method([(None, runs_dir)]))))
    sections.append(write_evidence(out / "evidence", evidence_by_round(find_runs(runs_dir), index, options.corpus)))

    page = out / "analysis.md"
    titles = {"table1": TABLE1_TITLE, "momentum": "Search momentum per system and pooled (this project's own views)",
              "drift": "Drift across rounds (3.3)",
              "stops": "Stop rounds (3.4)", "evidence": "Evidence recall by round"}
    parts = [f"# Analyses of {runs_dir}", ""]
    if not paper_runs:
        parts += [f"## {TABLE1_TITLE}", "", "No Search-o1 run on " + ", ".join(TABLE1_DATASETS.values())
                  + " in this input: Table 1 is not written.", ""]
    for section in sections:
        parts += [f"## {titles[section.name]}", "", section.markdown.strip(), "", f"![{section.name}]"
                  f"({section.plot.relative_to(out)})", ""]
    page.write_text("\n".join(parts), encoding="utf-8")
    if wandb_project or tracker is not None:
        log_to_wandb(
            "analyze-suite",
            {s.name: s.rows for s in sections},
            {f"{s.name}_plot": s.plot for s in sections},
            wandb_project or "maps-train",
            out,
            {"runs_dir": str(runs_dir), "encoder": encoder.name,
             "options": json.loads(json.dumps(asdict(options), default=str))},
            tracker,
        )
    return SuiteAnalysis(out, sections, page)
