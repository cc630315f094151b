"""Stop rounds (paper 3.4): per method, the share of questions that stop at round 1 and at round 5 or later.

Input: answer records (JSONL) with `rounds` per question, an int or the list of round records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl


@dataclass
class StopStats:
    method: str
    n: int
    mean_rounds: float
    share_round_1: float
    share_round_5_plus: float
    histogram: dict[int, int] = field(default_factory=dict)  # rounds -> questions


def load_stop_rounds(path: str | Path) -> list[tuple[str | None, int]]:
    """(method field or None, rounds) per answer record."""
    path = Path(path)
    records = []
    for number, row in iter_jsonl(path, "answers file"):
        rounds = row.get("rounds")
        if isinstance(rounds, list):
            rounds = len(rounds)
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
            raise MapsTrainError(f"{path}:{number}: field 'rounds' must be a non-negative int or a list")
        records.append((row.get("method"), rounds))
    return records


def stop_stats(method: str, rounds: list[int]) -> StopStats:
    if not rounds:
        raise MapsTrainError(f"stops: method '{method}' has no answer records")
    n = len(rounds)
    return StopStats(
        method,
        n,
        sum(rounds) / n,
        sum(r == 1 for r in rounds) / n,
        sum(r >= 5 for r in rounds) / n,
        dict(sorted(Counter(rounds).items())),
    )


def stops_markdown(stats: list[StopStats]) -> str:
    lines = ["| method | n | mean rounds | stop at round 1 | stop at round ≥5 |", "|---|---:|---:|---:|---:|"]
    for s in stats:
        lines.append(
            f"| {s.method} | {s.n} | {s.mean_rounds:.2f} | {100 * s.share_round_1:.1f}% | {100 * s.share_round_5_plus:.1f}% |"
        )
    return "\n".join(lines) + "\n"
