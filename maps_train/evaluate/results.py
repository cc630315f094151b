"""Per-question results: the answer-record contract, scoring one answer, and the append-only results file.

`results.jsonl` holds one line per (system, dataset, question_id). It is only ever appended to; a rerun reads it
first and scores only what is missing, so an interrupted suite resumes without duplicates. A line cut short by a
crash (no trailing newline) is dropped before the next append.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.evaluate.cost import COST_KEYS, ROLE_KEYS, compute_flops
from maps_train.evaluate.metrics import score_answer
from maps_train.questions import Question

# What the agent runner (`maps_train.agents.runner.run_method`) must put in each answer record.
REQUIRED_ANSWER_FIELDS = ("question_id", "answer")
OPTIONAL_ANSWER_FIELDS = ("method", "rounds", "stop_reason", "cost")

RESULT_KEY = ("system", "dataset", "question_id")


def check_answer_record(record: Any, where: str) -> dict[str, Any]:
    """The answer record as the runner contract defines it, or a one-line error naming the field."""
    if not isinstance(record, dict):
        raise MapsTrainError(f"{where}: answer record is {type(record).__name__}, expected a dict")
    for name in REQUIRED_ANSWER_FIELDS:
        if name not in record:
            raise MapsTrainError(f"{where}: answer record lacks '{name}'")
    if record["answer"] is not None and not isinstance(record["answer"], str):
        raise MapsTrainError(f"{where}: question {record['question_id']}: 'answer' must be a string")
    cost = record.get("cost")
    if cost is not None and not isinstance(cost, dict):
        raise MapsTrainError(f"{where}: question {record['question_id']}: 'cost' must be a mapping")
    return record


def normalise_cost(cost: dict[str, Any] | None) -> dict[str, Any]:
    """The runner's cost block with every counter the reports read present (0 when left out); extra keys
    (e.g. per-role latency, retrieval latency) are kept as they are."""
    cost = cost or {}
    result: dict[str, Any] = {**cost, **{key: cost.get(key) or 0 for key in COST_KEYS}}
    result["by_role"] = {
        role: {**(usage or {}), **{key: (usage or {}).get(key) or 0 for key in ROLE_KEYS}}
        for role, usage in (cost.get("by_role") or {}).items()
    }
    return result


def score_record(
    question: Question,
    answer: dict[str, Any],
    system: str,
    answer_mode: str,
    params_for_role: Callable[[str], int | None],
) -> dict[str, Any]:
    """One results.jsonl line: the answer, its metrics, its cost and estimated compute."""
    text = answer.get("answer") or ""
    metrics = score_answer(text, question.golden_answers, answer_mode, question.options)
    cost = normalise_cost(answer.get("cost"))
    return {
        "system": system,
        "dataset": question.dataset,
        "question_id": question.id,
        "question": question.question,
        "golden_answers": question.golden_answers,
        "answer_mode": answer_mode,
        "answer": text,
        **metrics,
        "method": answer.get("method"),
        "rounds": answer.get("rounds"),
        "stop_reason": answer.get("stop_reason"),
        "parse_failures": answer.get("parse_failures"),
        "cost": cost,
        "compute_flops": compute_flops(cost, params_for_role),
    }


class ResultsFile:
    """Append-only JSONL keyed by (system, dataset, question_id)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _repair_torn_tail(self) -> None:
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        with self.path.open("r+b") as handle:
            handle.truncate(keep)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        rows, seen = [], set()
        lines = self.path.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                if number == len(lines):  # a line cut short by a crash; dropped on the next append
                    continue
                raise MapsTrainError(f"{self.path}:{number}: invalid JSON ({err.msg})") from None
            key = tuple(row.get(k) for k in RESULT_KEY)
            if None in key:
                raise MapsTrainError(f"{self.path}:{number}: missing one of {', '.join(RESULT_KEY)}")
            if key not in seen:  # first line wins should a foreign tool have appended a duplicate
                seen.add(key)
                rows.append(row)
        return rows

    def keys(self) -> set[tuple]:
        return {tuple(row[k] for k in RESULT_KEY) for row in self.read()}

    def append(self, rows: Iterable[dict[str, Any]]) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        written = 0
        with self.path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                written += 1
            handle.flush()
        return written
