"""Stop rounds (paper 3.4): per method, the share of questions that stop at round 1 and that need 5 or more.

One definition for every method: a question's stop round is the number of retrieval rounds it actually executed,
`retrieval_rounds` of its answer record (one per batched search that held at least one of its queries; counted in
`maps_train.agents.engine.Engine.search`). A method's own `rounds` counts different things (MAPS rounds, Search-o1
turns including the answer turn, s3 steps after its initial retrieval), so it is only the fallback for records
written before `retrieval_rounds` existed; each table row says how many of its records needed the fallback.

Input: answer records (JSONL) with `retrieval_rounds` and/or `rounds` (an int, or the list of round records).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl


@dataclass
class StopRound:
    method: str | None  # the record's `method` field, if any
    rounds: int
    fallback: bool  # read from `rounds` (an old record without `retrieval_rounds`)


@dataclass
class StopStats:
    method: str
    n: int
    mean_rounds: float
    share_round_1: float
    share_round_5_plus: float
    share_no_search: float = 0.0  # answered without any retrieval (round 0)
    n_fallback: int = 0  # records without retrieval_rounds, counted by their `rounds`
    histogram: dict[int, int] = field(default_factory=dict)  # rounds -> questions

    @property
    def source(self) -> str:
        if not self.n_fallback:
            return "retrieval_rounds"
        if self.n_fallback == self.n:
            return "rounds (old records)"
        return f"retrieval_rounds; rounds for {self.n_fallback} old records"


def _count(value: Any) -> int | None:
    if isinstance(value, list):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def stop_round(row: dict[str, Any], where: str) -> StopRound:
    """A record's stop round: `retrieval_rounds`, else (an old record) `rounds`."""
    if row.get("retrieval_rounds") is not None:
        rounds = row["retrieval_rounds"]
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise MapsTrainError(f"{where}: field 'retrieval_rounds' must be a non-negative int")
        return StopRound(row.get("method"), rounds, False)
    rounds = _count(row.get("rounds"))
    if rounds is None:
        raise MapsTrainError(f"{where}: field 'rounds' must be a non-negative int or a list (no 'retrieval_rounds')")
    return StopRound(row.get("method"), rounds, True)


def read_stop_rounds(path: str | Path) -> list[StopRound]:
    path = Path(path)
    return [stop_round(row, f"{path}:{number}") for number, row in iter_jsonl(path, "answers file")]


def load_stop_rounds(path: str | Path) -> list[tuple[str | None, int]]:
    """(method field or None, stop round) per answer record."""
    return [(s.method, s.rounds) for s in read_stop_rounds(path)]


def stop_stats(method: str, rounds: list[int] | list[StopRound]) -> StopStats:
    if not rounds:
        raise MapsTrainError(f"stops: method '{method}' has no answer records")
    fallback = sum(1 for r in rounds if isinstance(r, StopRound) and r.fallback)
    values = [r.rounds if isinstance(r, StopRound) else r for r in rounds]
    n = len(values)
    return StopStats(
        method,
        n,
        sum(values) / n,
        sum(r == 1 for r in values) / n,
        sum(r >= 5 for r in values) / n,
        sum(r == 0 for r in values) / n,
        fallback,
        dict(sorted(Counter(values).items())),
    )


def stops_rows(stats: list[StopStats]) -> list[dict[str, Any]]:
    return [
        {
            "method": s.method,
            "n": s.n,
            "mean_rounds": s.mean_rounds,
            "share_round_1": s.share_round_1,
            "share_round_5_plus": s.share_round_5_plus,
            "share_no_search": s.share_no_search,
            "source": s.source,
        }
        for s in stats
    ]


def stops_markdown(stats: list[StopStats]) -> str:
    lines = [
        "| method | n | mean retrieval rounds | stop at round 1 | need ≥ 5 rounds | no retrieval | counted from |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in stats:
        lines.append(
            f"| {s.method} | {s.n} | {s.mean_rounds:.2f} | {100 * s.share_round_1:.1f}% "
            f"| {100 * s.share_round_5_plus:.1f}% | {100 * s.share_no_search:.1f}% | {s.source} |"
        )
    lines += [
        "",
        "A question's stop round is the number of retrieval rounds it executed (one per batched search holding at "
        "least one of its queries), the same count for every method.",
    ]
    return "\n".join(lines) + "\n"
