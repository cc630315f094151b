"""Paired comparisons of two systems on the same questions, with bootstrap intervals.

Two systems answered the same questions; the question is whether B differs from A by more than the questions'
draw explains. The paired bootstrap (Efron and Tibshirani; Koehn 2004 for NLP systems) resamples the questions
with replacement, keeping each question's pair together, and takes the 2.5th and 97.5th percentiles of the mean
difference B - A over the resamples as its 95% interval. An interval that excludes 0 says the difference is
unlikely to be the draw's; a figure without its interval says nothing.

`paired_rows` pairs two systems' `results.jsonl` rows by (dataset, question_id) on one measure (`MEASURES`), and
`comparison_table` writes the Markdown table the learning study reports. `transfer` measures how much of a
teacher's lead over the base a trained system closed, (S - base) / (teacher - base), with the same bootstrap over
questions (the ratio of means recomputed per resample).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from maps_train.errors import MapsTrainError


def _tokens(row: dict[str, Any]) -> float:
    cost = row.get("cost") or {}
    return float(cost.get("prompt_tokens", 0)) + float(cost.get("completion_tokens", 0))


# measure -> (title, how to read it from a results.jsonl row; None: the row has no such figure)
MEASURES: dict[str, tuple[str, Callable[[dict[str, Any]], float | None]]] = {
    "evidence_recall": ("Evidence recall, retrieved", lambda row: row.get("evidence_recall")),
    "evidence_recall_seen": ("Evidence recall, seen", lambda row: row.get("evidence_recall_seen")),
    "em": ("EM", lambda row: row.get("em")),
    "f1": ("F1", lambda row: row.get("f1")),
    "cover_em": ("Cover-EM", lambda row: row.get("cover_em")),
    "retrievals": ("Retrievals", lambda row: float((row.get("cost") or {}).get("retrievals", 0))),
    "rounds": ("Rounds", lambda row: float(row.get("rounds") or 0)),
    "tokens": ("Tokens", _tokens),
}
SCORES = ("evidence_recall", "evidence_recall_seen", "em", "f1", "cover_em")  # shown x 100


@dataclass(frozen=True)
class PairedDifference:
    measure: str
    questions: int
    mean_a: float
    mean_b: float
    low: float  # the 95% interval of mean(B) - mean(A)
    high: float

    @property
    def difference(self) -> float:
        return self.mean_b - self.mean_a

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float]:
    """The `level` percentile interval of mean(b) - mean(a) over `resamples` paired resamples of the questions."""
    if len(a) != len(b):
        raise MapsTrainError(f"paired bootstrap: {len(a)} and {len(b)} values; pairs must be complete")
    if not a:
        raise MapsTrainError("paired bootstrap: no paired questions")
    diffs = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 1000):  # bounded memory whatever the number of questions
        stop = min(start + 1000, resamples)
        means[start:stop] = diffs[rng.integers(0, len(diffs), size=(stop - start, len(diffs)))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


SEEDS_JOIN = "+"  # "a+b+c": one side of a pair that is the per-question mean of systems a, b and c (seeds)


def _system_values(rows: Iterable[dict[str, Any]], system: str, read: Callable[[dict[str, Any]], float | None],
                   datasets: set[str] | None) -> dict[tuple[str, str], float]:
    """(dataset, question id) -> the measure of `system`; of a "+"-joined system, the mean of its members on the
    questions every member answered."""
    members = system.split(SEEDS_JOIN)
    values: dict[str, dict[tuple[str, str], float]] = {member: {} for member in members}
    for row in rows:
        if row.get("system") in values and (datasets is None or row.get("dataset") in datasets):
            value = read(row)
            if value is not None:
                values[row["system"]][(str(row.get("dataset")), str(row.get("question_id")))] = float(value)
    keys = set.intersection(*(set(found) for found in values.values()))
    return {key: sum(values[member][key] for member in members) / len(members) for key in keys}


def paired_rows(rows: Iterable[dict[str, Any]], system_a: str, system_b: str, measure: str,
                datasets: set[str] | None = None) -> tuple[list[float], list[float]]:
    """The measure of A and B on every question both answered and both have it for, in one order. A side may
    join systems with "+" ("rl_seed0+rl_seed1"): their per-question mean, so the interval is over questions with
    the seeds averaged."""
    if measure not in MEASURES:
        raise MapsTrainError(f"measure: unknown '{measure}' (known: {', '.join(MEASURES)})")
    rows = list(rows)
    a = _system_values(rows, system_a, MEASURES[measure][1], datasets)
    b = _system_values(rows, system_b, MEASURES[measure][1], datasets)
    keys = sorted(a.keys() & b.keys())
    return [a[k] for k in keys], [b[k] for k in keys]


def compare(rows: Sequence[dict[str, Any]], system_a: str, system_b: str, measure: str, *,
            datasets: set[str] | None = None, resamples: int = 10_000, seed: int = 0) -> PairedDifference | None:
    """B against A on `measure`; None when no question pairs."""
    a, b = paired_rows(rows, system_a, system_b, measure, datasets)
    if not a:
        return None
    low, high = paired_bootstrap(a, b, resamples=resamples, seed=seed)
    return PairedDifference(measure, len(a), float(np.mean(a)), float(np.mean(b)), low, high)


def _figure(measure: str, value: float) -> str:
    return f"{value * 100:.1f}" if measure in SCORES else f"{value:,.1f}" if measure != "tokens" else f"{value:,.0f}"


def comparison_table(rows: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str]],
                     measures: Sequence[str] = tuple(MEASURES), *, datasets: set[str] | None = None,
                     resamples: int = 10_000, seed: int = 0) -> str:
    """A Markdown table: per pair (A -> B) and measure, both means, B - A and its 95% paired bootstrap interval
    (scores x 100), and whether the interval excludes 0."""
    lines = ["| A -> B | measure | questions | A | B | B - A | 95% interval | excludes 0 |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for system_a, system_b in pairs:
        for measure in measures:
            result = compare(rows, system_a, system_b, measure, datasets=datasets, resamples=resamples, seed=seed)
            if result is None:
                continue
            scale = 100 if measure in SCORES else 1
            lines.append(
                f"| {system_a} -> {system_b} | {MEASURES[measure][0]} | {result.questions} | "
                f"{_figure(measure, result.mean_a)} | {_figure(measure, result.mean_b)} | "
                f"{result.difference * scale:+.1f} | [{result.low * scale:+.1f}, {result.high * scale:+.1f}] | "
                f"{'yes' if result.excludes_zero else 'no'} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Transfer:
    """How much of the teacher's lead over the base a trained system closed: (S - base) / (teacher - base), on the
    means over the questions all three answered."""

    measure: str
    questions: int
    mean_base: float
    mean_teacher: float
    mean_system: float
    ratio: float | None  # None: the teacher's mean equals the base's (no gap to close)
    low: float | None  # the 95% interval over the resamples whose gap is not 0
    high: float | None
    undefined: int  # resamples left out because their teacher - base gap was 0


def transfer(rows: Sequence[dict[str, Any]], system: str, base: str, teacher: str, measure: str, *,
             datasets: set[str] | None = None, resamples: int = 10_000, seed: int = 0,
             level: float = 0.95) -> Transfer | None:
    """The transfer of `system` (see `Transfer`) with a paired bootstrap interval: the questions are resampled with
    replacement, each keeping its three values together, and the ratio of means recomputed per resample. A
    resample whose teacher and base means are equal has no ratio: it is left out and counted (`undefined`); the
    interval is the percentiles of the others (None when none is left). None when no question has all three."""
    if measure not in MEASURES:
        raise MapsTrainError(f"measure: unknown '{measure}' (known: {', '.join(MEASURES)})")
    rows = list(rows)
    read = MEASURES[measure][1]
    found = [_system_values(rows, name, read, datasets) for name in (system, base, teacher)]
    keys = sorted(set.intersection(*(set(values) for values in found)))
    if not keys:
        return None
    s, b, t = (np.asarray([values[k] for k in keys], dtype=np.float64) for values in found)
    gap = t.mean() - b.mean()
    ratio = float((s.mean() - b.mean()) / gap) if gap != 0 else None
    rng = np.random.default_rng(seed)
    ratios: list[np.ndarray] = []
    undefined = 0
    for start in range(0, resamples, 1000):
        index = rng.integers(0, len(keys), size=(min(start + 1000, resamples) - start, len(keys)))
        mb = b[index].mean(axis=1)
        gaps = t[index].mean(axis=1) - mb
        defined = gaps != 0
        undefined += int((~defined).sum())
        ratios.append((s[index].mean(axis=1)[defined] - mb[defined]) / gaps[defined])
    kept = np.concatenate(ratios)
    low = high = None
    if kept.size:
        tail = (1.0 - level) / 2 * 100
        low, high = (float(v) for v in np.percentile(kept, [tail, 100 - tail]))
    return Transfer(measure, len(keys), float(b.mean()), float(t.mean()), float(s.mean()), ratio, low, high,
                    undefined)


def transfer_table(rows: Sequence[dict[str, Any]], systems: Sequence[str], base: str, teacher: str,
                   measures: Sequence[str] = ("evidence_recall", "em", "f1"), *, datasets: set[str] | None = None,
                   resamples: int = 10_000, seed: int = 0) -> str:
    """A Markdown table: per trained system and measure, the three means (x 100), the transfer and its 95% paired
    bootstrap interval, and the resamples left out for a zero gap ("-": undefined)."""
    lines = [f"| system | measure | questions | {base} | {teacher} | system | transfer | 95% interval | "
             "resamples left out |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for system in systems:
        for measure in measures:
            result = transfer(rows, system, base, teacher, measure, datasets=datasets, resamples=resamples, seed=seed)
            if result is None:
                continue
            ratio = "-" if result.ratio is None else f"{result.ratio:+.2f}"
            interval = "-" if result.low is None else f"[{result.low:+.2f}, {result.high:+.2f}]"
            lines.append(f"| {system} | {MEASURES[measure][0]} | {result.questions} | "
                         f"{_figure(measure, result.mean_base)} | {_figure(measure, result.mean_teacher)} | "
                         f"{_figure(measure, result.mean_system)} | {ratio} | {interval} | {result.undefined} |")
    return "\n".join(lines)


def parse_pair(text: str) -> tuple[str, str]:
    """"A>B" -> (A, B); a one-line error for anything else."""
    parts = [part.strip() for part in text.split(">")]
    if len(parts) != 2 or not all(parts):
        raise MapsTrainError(f"pair '{text}': write it A>B (B against A; a side may join seeds with +)")
    return parts[0], parts[1]


def check_systems(rows: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str]]) -> None:
    """A one-line error naming the first system of `pairs` that no row holds, and the systems that are there."""
    known = sorted({str(row.get("system")) for row in rows})
    for pair in pairs:
        for side in pair:
            for system in side.split(SEEDS_JOIN):
                if system not in known:
                    raise MapsTrainError(f"system '{system}' is in no results read (there: {', '.join(known)})")


__all__ = ["MEASURES", "PairedDifference", "Transfer", "check_systems", "compare", "comparison_table",
           "paired_bootstrap", "paired_rows", "parse_pair", "transfer", "transfer_table"]
