"""Per-question results: scoring one answer record into a line of `results.jsonl`.

`results.jsonl` holds one line per (system, dataset, question_id), written through the keyed append-only store
(`maps_train.records.store.KeyedJsonl`, `RESULT_KEY`): a rerun reads it first and scores only what is missing,
so an interrupted suite resumes without duplicates. A question with gold passages also carries its evidence recall
(`gold_passages`, `evidence_recall`, `evidence_recall_seen`; see `evidence_recall.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.evaluate.cost import compute_flops
from maps_train.questions import Question
from maps_train.records.answer import AnswerRecord
from maps_train.records.metrics import score_answer
from maps_train.records.shards import RESULT_KEY
from maps_train.records.store import KeyedJsonl, read_records


def results_file(path: str | Path) -> KeyedJsonl:
    return KeyedJsonl(path, key=RESULT_KEY)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file in order (a torn last line skipped, the file left as it is)."""
    return list(results_file(path).load(repair=False).values())


def split_source(source: str) -> tuple[str, Path]:
    """A `--results` value as (label, path): a value that names an existing path is that path, unlabelled (so
    `./a=b` can be named as it is); else "LABEL=PATH" splits at the first "=" (a label holds no "=", so
    `run1=./a=b` labels the path `./a=b`)."""
    if "=" not in source or Path(source).exists():
        return "", Path(source)
    label, _, path = source.partition("=")
    if not label.strip() or "/" in label:
        raise MapsTrainError(f"--results {source}: the label before '=' must be a plain name (no '/')")
    return label, Path(path)


RESULT_NUMBERS = ("evidence_recall", "evidence_recall_seen", "em", "f1", "cover_em", "rounds")
COST_NUMBERS = ("retrievals", "prompt_tokens", "completion_tokens")


def _number_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return None
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return f"expected a number or null, got {shown if len(shown) <= 40 else shown[:37] + '...'}"


def check_result_row(row: dict[str, Any], where: str) -> None:
    """A one-line error naming `where` (file:line) and the field of a row `compare` cannot read."""
    for name in ("system", "dataset", "question_id"):
        if not isinstance(row.get(name), (str, int)) or isinstance(row.get(name), bool):
            raise MapsTrainError(f"{where}: field '{name}': expected a name, got {json.dumps(row.get(name))[:40]}")
    for name in RESULT_NUMBERS:
        problem = _number_problem(row.get(name))
        if problem:
            raise MapsTrainError(f"{where}: field '{name}': {problem}")
    cost = row.get("cost")
    if cost is not None and not isinstance(cost, dict):
        raise MapsTrainError(f"{where}: field 'cost': expected an object or null, got {json.dumps(cost)[:40]}")
    for name in COST_NUMBERS:
        problem = _number_problem((cost or {}).get(name))
        if problem:
            raise MapsTrainError(f"{where}: field 'cost.{name}': {problem}")


def read_labelled_results(source: str) -> list[dict[str, Any]]:
    """The rows of `source`: a results file or a suite's out_dir holding one; "LABEL=PATH" renames each row's
    system LABEL/<system>, so two runs' systems of one name (two studies' maps_sft) can be compared (see
    `split_source`). Every row is checked (`check_result_row`): a value no measure can read is one line naming
    the file, line and field."""
    label, target = split_source(source)
    if target.is_dir():
        target = target / "results.jsonl"
    if not target.is_file():
        raise MapsTrainError(f"--results {source}: no results file at {target}")
    rows: dict[Any, dict[str, Any]] = {}
    for number, row in read_records(target, repair=False):  # a torn last line skipped, the file left as it is
        check_result_row(row, f"{target}:{number}")
        rows.setdefault(tuple(str(row.get(name)) for name in RESULT_KEY), row)
    return [{**row, "system": f"{label}/{row['system']}"} for row in rows.values()] if label else list(rows.values())


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
