"""`maps-train study RECIPE SUITE`: the learning study in one command, every stage resumable.

Does training make the agent better at its job? The study answers on real questions held apart from training:

    split       ../shared/realdata -> <out>/split/{train.jsonl, dev/<dataset>.jsonl, split.json} (fixed seed)
    traces      the teacher (the recipe's roles) samples k MAPS runs a train question (`maps-train traces`)
    sft-data    rows kept per role by their credit (`sft_data.filter: role`, `maps-train sft-data`)
    train       one LoRA adapter per role (`maps-train train --role all`)
    rl          GRPO on `rl.roles` from the SFT adapters (`maps-train rl`; only with --rl)
    eval        the suite on the dev questions: Vanilla RAG and every stage, with the deployed decoding
    report      <out>/STUDY.md: per system the means, and between consecutive stages and against Vanilla RAG the
                paired bootstrap 95% intervals (`evaluate.paired`), with each stage's time

Each stage is the command a user would run, printed before it runs, so any one can be rerun by hand, and each
resumes where a killed study stopped. Suite overrides after the suite (e.g. `datasets=[...]`) go to the eval, so
the same adapters can be evaluated on other questions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from maps_train.demo import _environment, _run_step
from maps_train.errors import MapsTrainError
from maps_train.evaluate.paired import MEASURES, SCORES, comparison_table
from maps_train.evaluate.results import read_results
from maps_train.paths import write_text_atomic
from maps_train.study.split import SPLIT_FILE, split_questions

# The stages in their order, as the systems of eval/suites/learning_study.yaml name them.
STAGES = ("maps_base", "maps_sft", "maps_rl")
BASELINE = "vanilla_rag"
TIMES_FILE = "times.json"


def study_pairs(systems: list[str]) -> list[tuple[str, str]]:
    """Consecutive stages, then every stage against Vanilla RAG, among the systems the results hold."""
    stages = [s for s in STAGES if s in systems]
    pairs = list(zip(stages, stages[1:]))
    if BASELINE in systems:
        pairs += [(BASELINE, stage) for stage in stages]
    return pairs


def means_table(rows: list[dict], systems: list[str]) -> str:
    """Per system: questions and the mean of every measure (scores x 100)."""
    header = "| system | questions | " + " | ".join(MEASURES[m][0] for m in MEASURES) + " |"
    lines = [header, "|---|---:|" + "---:|" * len(MEASURES)]
    for system in systems:
        mine = [row for row in rows if row.get("system") == system]
        cells = []
        for measure, (_, read) in MEASURES.items():
            values = [v for v in (read(row) for row in mine) if v is not None]
            mean = sum(values) / len(values) if values else float("nan")
            cells.append(f"{mean * 100:.1f}" if measure in SCORES else f"{mean:,.1f}")
        lines.append(f"| {system} | {len(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_study_report(results_path: Path, out: Path, times: dict[str, float]) -> Path:
    rows = read_results(results_path)
    if not rows:
        raise MapsTrainError(f"{results_path}: no results to report")
    systems = [s for s in (BASELINE, *STAGES) if any(row.get("system") == s for row in rows)]
    datasets = sorted({str(row.get("dataset")) for row in rows})
    parts = ["# Learning study", "", f"Results: `{results_path}`; data sets: {', '.join(datasets)}.", "",
             "## Means on dev (scores x 100; costs per question)", "", means_table(rows, systems), "",
             "## Paired differences (B - A; 95% paired bootstrap interval, 10,000 resamples)", "",
             comparison_table(rows, study_pairs(systems)), ""]
    for dataset in datasets:
        parts += [f"### {dataset}", "",
                  comparison_table(rows, study_pairs(systems), ["evidence_recall", "em", "f1", "retrievals"],
                                   datasets={dataset}), ""]
    if times:
        parts += ["## Stage times", "", "| stage | seconds |", "|---|---:|"]
        parts += [f"| {stage} | {seconds:.0f} |" for stage, seconds in times.items()] + [""]
    report = out / "STUDY.md"
    write_text_atomic(report, "\n".join(parts))
    return report


def run_study(recipe: str, suite: str, suite_overrides: list[str], *, data_root: str, out: Path, dev: int,
              train: int, seed: int, rl: bool) -> Path:
    env = _environment()
    logs = out / "logs"
    times_path = out / TIMES_FILE
    times: dict[str, float] = json.loads(times_path.read_text()) if times_path.is_file() else {}

    def stage(name: str, args: list[str]) -> None:
        times[name] = times.get(name, 0.0) + _run_step(name, args, logs, env)
        write_text_atomic(times_path, json.dumps(times, indent=1) + "\n")

    start = time.perf_counter()
    record = split_questions(data_root, out / "split", dev=dev, train=train, seed=seed)
    typer.echo(f"split: dev {sum(map(len, record['dev'].values()))}, train {sum(map(len, record['train'].values()))} "
               f"questions (seed {seed}; {out / 'split' / SPLIT_FILE})")
    times["split"] = time.perf_counter() - start
    stage("traces", ["traces", recipe])
    stage("sft-data", ["sft-data", recipe])
    stage("train", ["train", recipe, "--role", "all"])
    if rl:
        stage("rl", ["rl", recipe])
    systems = [] if rl else ["--system", BASELINE, "--system", STAGES[0], "--system", STAGES[1]]
    stage("eval", ["eval", suite, *suite_overrides, *systems])
    from maps_train.evaluate.suite import load_suite

    config = load_suite(suite, suite_overrides)
    report = write_study_report(Path(config.out_dir) / "results.jsonl", out, times)
    typer.echo(f"\nstudy report: {report}")
    return report


def register(app: typer.Typer) -> None:
    @app.command("study")
    def study(
        recipe: str = typer.Argument("recipes/study/learning.yaml", help="The study's recipe (traces, SFT, RL)."),
        suite: str = typer.Argument("eval/suites/learning_study.yaml", help="The dev evaluation suite."),
        overrides: list[str] = typer.Argument(None, help="Suite overrides for the eval, e.g. datasets=[...]"),
        data_root: str = typer.Option("../shared/realdata", help="Where the QA sets are read (never copied)."),
        out: str = typer.Option("runs/learning-study", help="The study's folder (split, logs, STUDY.md)."),
        dev: int = typer.Option(38, help="Dev questions per data set (never trained on)."),
        train: int = typer.Option(25, help="Train questions per data set."),
        seed: int = typer.Option(0, help="The split's seed."),
        rl: bool = typer.Option(False, "--rl", help="Also run the RL stage and evaluate it (maps_rl)."),
    ) -> None:
        """The learning study: split, traces, credit-filtered SFT (and RL), dev eval, paired intervals."""
        run_study(recipe, suite, overrides or [], data_root=data_root, out=Path(out), dev=dev, train=train,
                  seed=seed, rl=rl)
