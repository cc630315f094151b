"""<out>/STUDY.md: what a learning study measured, every evaluated system of its suite.

- the split's digest (sha256 of split.json: the ids on each side) and the data sets;
- per system the means of every measure;
- paired differences with 95% bootstrap intervals (`evaluate.paired`): the base against each trained system, the
  baseline (Vanilla RAG) against each system that is not it, and each SFT system against each RL one; overall and
  per data set;
- with a `teacher` system in the results (teacher rows written into the eval's results.jsonl): the transfer of each
  trained system, (S - base) / (teacher - base), with its paired bootstrap interval, overall and per data set;
- the systems the study did not evaluate, and why; each stage's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.evaluate.paired import MEASURES, SCORES, comparison_table, transfer_table
from maps_train.evaluate.results import read_results
from maps_train.paths import write_text_atomic

TEACHER = "teacher"  # the system name whose rows the transfer is measured against
REPORT_MEASURES = ["evidence_recall", "em", "f1", "retrievals"]


def study_pairs(systems: Sequence[str], base: str, baseline: str, rl_systems: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Among `systems`: base -> each trained system, baseline -> each other system, each SFT system -> each RL
    system (a trained system is neither the base, the baseline nor the teacher)."""
    trained = [s for s in systems if s not in (base, baseline, TEACHER)]
    pairs = [(base, s) for s in trained] if base in systems else []
    if baseline in systems:
        pairs += [(baseline, s) for s in systems if s not in (baseline, TEACHER)]
    sft = [s for s in trained if s not in rl_systems]
    pairs += [(a, b) for a in sft for b in trained if b in rl_systems]
    return list(dict.fromkeys(pairs))


def means_table(rows: list[dict], systems: Sequence[str]) -> str:
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


def write_study_report(results_path: Path, out: Path, times: dict[str, float], *, systems: Sequence[str],
                       base: str, baseline: str, rl_systems: Sequence[str] = (), dropped: Sequence[str] = (),
                       datasets: Sequence[str] | None = None, split_digest: str | None = None) -> Path:
    """STUDY.md (module docstring) from the eval's results, for `systems` (and the teacher where the results
    hold one) on `datasets` (all the results hold when None)."""
    rows = read_results(results_path)
    if datasets is not None:
        rows = [row for row in rows if row.get("dataset") in set(datasets)]
    if not rows:
        raise MapsTrainError(f"{results_path}: no results to report")
    present = {str(row.get("system")) for row in rows}
    missing = [s for s in systems if s not in present]
    if missing:
        raise MapsTrainError(f"{results_path}: no results of {', '.join(missing)} (the study evaluated them)")
    shown = [*systems, *([TEACHER] if TEACHER in present and TEACHER not in systems else [])]
    rows = [row for row in rows if row.get("system") in shown]
    names = sorted({str(row.get("dataset")) for row in rows})
    pairs = study_pairs(shown, base, baseline, rl_systems)
    parts = ["# Learning study", ""]
    if split_digest:
        parts += [f"Split: sha256 `{split_digest}` of `split/split.json` (the ids on each side).", ""]
    parts += [f"Results: `{results_path}`; data sets: {', '.join(names)}; base `{base}`, baseline `{baseline}`.", ""]
    if dropped:
        parts += [f"Not evaluated: {', '.join(dropped)} (they serve the RL stage's adapters; run the study with "
                  "--rl).", ""]
    parts += ["## Means on dev (scores x 100; costs per question)", "", means_table(rows, shown), "",
              "## Paired differences (B - A; 95% paired bootstrap interval, 10,000 resamples)", "",
              comparison_table(rows, pairs), ""]
    for dataset in names:
        parts += [f"### {dataset}", "", comparison_table(rows, pairs, REPORT_MEASURES, datasets={dataset}), ""]
    trained = [s for s in shown if s not in (base, baseline, TEACHER)]
    if TEACHER in shown and base in shown and trained:
        parts += ["## Transfer: (system - base) / (teacher - base)", "",
                  "1 closes the teacher's lead over the base, 0 is the base, below 0 worse than the base. The "
                  "interval: questions resampled with their three values together, the ratio of means recomputed "
                  "(10,000 resamples); a resample whose teacher and base means are equal has no ratio and is left "
                  "out (counted in the last column); '-' where the full sample's gap is 0.", "",
                  transfer_table(rows, trained, base, TEACHER), ""]
        for dataset in names:
            parts += [f"### Transfer, {dataset}", "", transfer_table(rows, trained, base, TEACHER,
                                                                     datasets={dataset}), ""]
    if times:
        parts += ["## Stage times", "", "| stage | seconds |", "|---|---:|"]
        parts += [f"| {stage} | {seconds:.0f} |" for stage, seconds in times.items()] + [""]
    report = out / "STUDY.md"
    write_text_atomic(report, "\n".join(parts))
    return report


__all__ = ["TEACHER", "means_table", "study_pairs", "write_study_report"]
