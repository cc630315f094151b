"""Per-question results: scoring one answer record into a line of `results.jsonl`.

`results.jsonl` holds one line per (system, dataset, question_id), written through the keyed append-only store
(`maps_train.records.store.KeyedJsonl`, `RESULT_KEY`): a rerun reads it first and scores only what is missing,
so an interrupted suite resumes without duplicates. A question with gold passages also carries its evidence recall
(`gold_passages`, `evidence_recall`, `evidence_recall_seen`; see `evidence_recall.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.evaluate.cost import compute_flops
from maps_train.questions import Question
from maps_train.records.answer import AnswerRecord
from maps_train.records.metrics import score_answer
from maps_train.records.shards import RESULT_KEY
from maps_train.records.store import KeyedJsonl


def results_file(path: str | Path) -> KeyedJsonl:
    return KeyedJsonl(path, key=RESULT_KEY)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file in order (a torn last line skipped, the file left as it is)."""
    return list(results_file(path).load(repair=False).values())


def read_labelled_results(source: str) -> list[dict[str, Any]]:
    """The rows of `source`: a results file or a suite's out_dir holding one; "LABEL=PATH" renames each row's
    system LABEL/<system>, so two runs' systems of one name (two studies' maps_sft) can be compared."""
    label, _, path = source.partition("=") if "=" in source else ("", "", source)
    target = Path(path)
    if target.is_dir():
        target = target / "results.jsonl"
    if not target.is_file():
        raise MapsTrainError(f"--results {source}: no results file at {target}")
    rows = read_results(target)
    return [{**row, "system": f"{label}/{row['system']}"} for row in rows] if label else rows


def score_record(
    question: Question,
    answer: AnswerRecord,
    system: str,
    answer_mode: str,
    params_for_role: Callable[[str], int | None],
    normalizer: str = "flashrag",
    evidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One results.jsonl line: the answer, its metrics, its cost and estimated compute, and (for a question with
    gold passages) its evidence recall, `evidence` as `evidence_recall.evidence_fields` gives it."""
    text = answer.answer or ""
    metrics = score_answer(text, question.golden_answers, answer_mode, question.options, normalizer=normalizer)
    cost = answer.cost.to_dict()
    return {
        "system": system,
        "dataset": question.dataset,
        "question_id": question.id,
        "question": question.question,
        "golden_answers": question.golden_answers,
        "answer_mode": answer_mode,
        "answer": text,
        **metrics,
        "method": answer.method,
        "rounds": answer.rounds,
        "retrieval_rounds": answer.retrieval_rounds,
        "stop_reason": answer.stop_reason,
        "parse_failures": answer.parse_failures,
        "cost": cost,
        "compute_flops": compute_flops(cost, params_for_role),
        **(evidence or {}),
    }
