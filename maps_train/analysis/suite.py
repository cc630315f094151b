"""`maps-train analyze suite RUNS_DIR`: momentum, drift and stop rounds for every system of an eval suite's output.

One command after `maps-train eval eval/suites/paper.yaml` gives the paper's Table 1 (momentum per method), the
3.3 drift curves and the 3.4 stop-round shares, from the runs' own traces and answer records:

    <out>/momentum/{momentum.md, .csv, .json, .png}   β_t and S_t per system and pooled
    <out>/drift/{drift.md, .csv, .png}                 500 seeded questions across the data sets, β of the pooled fit
    <out>/stops/{stops.md, .csv, .png}                 retrieval rounds executed per question
    <out>/analysis.md                                  the three tables in one page
and, with W&B on, one run holding the tables and plots.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from maps_train.analysis.drift import DRIFT_QUESTIONS
from maps_train.analysis.embed import DEFAULT_ENCODER, TextEncoder
from maps_train.analysis.inputs import sequences_by_method, stop_rounds_by_method
from maps_train.analysis.momentum import MomentumOptions
from maps_train.analysis.report import log_to_wandb
from maps_train.analysis.runs import QuestionIndex, find_runs
from maps_train.analysis.sections import (
    Written,
    drift_betas,
    run_drift,
    run_momentum,
    run_stops,
    write_drift,
    write_momentum,
    write_stops,
)


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
    find_runs(runs_dir)  # fail at once, naming the folder, when there is nothing to analyse
    encoder = encoder or TextEncoder(options.encoder)
    index = QuestionIndex(options.questions, options.data_root, options.corpus)

    sequences = sequences_by_method([(None, runs_dir)], index, include_question_searches=options.include_question_searches)
    extra = {"input": str(runs_dir), "include_question_searches": options.include_question_searches}
    momentum = run_momentum(sequences, encoder, options.momentum, extra)
    sections = [write_momentum(out / "momentum", momentum)]

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

    page = out / "analysis.md"
    titles = {"momentum": "Search momentum (Table 1)", "drift": "Drift across rounds (3.3)",
              "stops": "Stop rounds (3.4)"}
    parts = [f"# Analyses of {runs_dir}", ""]
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
