"""The question record every method answers and every dataset loader yields (FlashRAG JSONL convention).

Every row is checked field by field (`question_from_row`), so a wrong type is one error line naming the file, line
and field rather than a silent misread: `golden_answers: "Paris"` is the one alias "Paris" (not five letters), a
null id is an error (an absent id is generated as `{dataset}-{line}`), `options` must be a list of strings. A
question id seen twice in one file is an error naming both lines (results are keyed by id).

Bounds, checked as each row loads so bad input stops before any model runs: a line of a questions file is at
most `MAX_LINE_BYTES` (read only that far), a question at most `MAX_QUESTION_CHARS` characters, an option at most
`MAX_OPTION_CHARS`, and at most `MAX_OPTIONS` options (one per answer letter A-J that scoring knows). An id must
be valid Unicode text: a lone surrogate (JSON `"\\ud800"`) is refused, since every file written holds valid UTF-8
and the id would come back as U+FFFD, never matching on resume.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl

# A multi-hop question is a few hundred characters and a GPQA one a few thousand; far beyond these a row is a
# mistake (a document pasted as the question), and it would fill every prompt of every round with it.
MAX_QUESTION_CHARS = 32_000
MAX_OPTION_CHARS = 8_000
MAX_OPTIONS = 10  # the answer letters A-J of `records.metrics.LETTERS`: an 11th option could never be scored
# FlashRAG rows carry metadata (supporting facts, contexts) of tens of KB; 4 MiB is far above any real row.
MAX_LINE_BYTES = 4 * 1024 * 1024


@dataclass
class Question:
    id: str
    question: str
    golden_answers: list[str] = field(default_factory=list)
    # Multiple choice (GPQA): the options in the order shown, labelled A, B, C, ...; the gold answer is a letter.
    options: list[str] | None = None
    dataset: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any], dataset: str = "", where: str = "question") -> Question:
        """A checked Question; a bad field raises `MapsTrainError` starting with `where` (`file:line`)."""
        return question_from_row(row, where, dataset)


# --- field checks: each returns the value to store or raises naming `where: field` ------------------------------


def _kind(value: Any) -> str:
    """A JSON-ish name for a value's type, for error messages."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _check_id(value: Any, where: str) -> str:
    # bool is an int subclass and a float id (1.0 vs 1) would not round-trip: both are refused
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise MapsTrainError(f"{where}: id: expected a string or an integer, got {_kind(value)}")
    text = str(value)
    if not text.strip():
        raise MapsTrainError(f"{where}: id: empty string (leave the field out to get a generated id)")
    if safejson.has_lone_surrogate(text):
        raise MapsTrainError(f"{where}: id: holds a lone surrogate ({text[:40]!r}), which no UTF-8 file can store")
    return text


def _check_question(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MapsTrainError(f"{where}: question: expected a string, got {_kind(value)}")
    if not value.strip():
        raise MapsTrainError(f"{where}: question: empty string")
    if len(value) > MAX_QUESTION_CHARS:
        raise MapsTrainError(f"{where}: question: {len(value):,} characters (at most {MAX_QUESTION_CHARS:,})")
    return value


def _answer_text(value: Any, where: str) -> str:
    """One gold alias: strings as they are, numbers (FlashRAG has numeric answers) as their decimal text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise MapsTrainError(f"{where}: expected a string or a number, got {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise MapsTrainError(f"{where}: expected a finite number, got {value}")
    text = str(value)
    if not text.strip():
        # an empty alias is a substring of every answer: cover-EM would score everything correct
        raise MapsTrainError(f"{where}: empty answer")
    return text


def _check_golden_answers(value: Any, where: str) -> list[str]:
    if value is None:  # absent or null: a question without gold answers (e.g. for inference only)
        return []
    if isinstance(value, str):  # one alias, not one alias per character
        return [_answer_text(value, f"{where}: golden_answers")]
    if not isinstance(value, list):
        raise MapsTrainError(f"{where}: golden_answers: expected a list of strings (or one string), got {_kind(value)}")
    return [_answer_text(item, f"{where}: golden_answers[{i}]") for i, item in enumerate(value)]


def _check_options(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):  # a string would silently become one option per character
        raise MapsTrainError(f"{where}: options: expected a list of strings, got {_kind(value)}")
    if not value:
        raise MapsTrainError(f"{where}: options: empty list (leave the field out for a short-answer question)")
    if len(value) > MAX_OPTIONS:
        raise MapsTrainError(f"{where}: options: {len(value)} options, at most {MAX_OPTIONS} (letters A-J)")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise MapsTrainError(f"{where}: options[{i}]: expected a string, got {_kind(item)}")
        if not item.strip():
            raise MapsTrainError(f"{where}: options[{i}]: empty string")
        if len(item) > MAX_OPTION_CHARS:
            raise MapsTrainError(f"{where}: options[{i}]: {len(item):,} characters (at most {MAX_OPTION_CHARS:,})")
    return list(value)


def _check_metadata(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MapsTrainError(f"{where}: metadata: expected an object, got {_kind(value)}")
    return value


def _check_dataset(value: Any, where: str, default: str) -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise MapsTrainError(f"{where}: dataset: expected a string, got {_kind(value)}")
    return value


def question_from_row(row: dict[str, Any], where: str, dataset: str = "") -> Question:
    """One decoded row (FlashRAG fields) as a Question; every error starts with `where: field`.

    `id` is required here (callers that generate ids for rows without one add it first); `golden_answers`,
    `options` and `metadata` may be absent or null. Other fields are ignored.
    """
    if "id" not in row:
        raise MapsTrainError(f"{where}: missing field 'id'")
    if "question" not in row:
        raise MapsTrainError(f"{where}: missing field 'question'")
    return Question(
        id=_check_id(row["id"], where),
        question=_check_question(row["question"], where),
        golden_answers=_check_golden_answers(row.get("golden_answers"), where),
        options=_check_options(row.get("options"), where),
        dataset=_check_dataset(row.get("dataset"), where, dataset),
        metadata=_check_metadata(row.get("metadata"), where),
    )


class UniqueIds:
    """Where each question id was first seen; seeing one again is an error naming both places.

    `add(id, where, place)`: `where` starts the error line (`file:7`), `place` is how the first sighting is
    named in a later error (`line 7`, `row 7`).
    """

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def add(self, question_id: str, where: str, place: str) -> None:
        if question_id in self._first:
            first = self._first[question_id]
            raise MapsTrainError(f"{where}: id: question id {question_id!r} appears twice (first at {first})")
        self._first[question_id] = place


# --- files --------------------------------------------------------------------------------------------------------


def iter_questions(path: str | Path, dataset: str | None = None) -> Iterator[Question]:
    """Read FlashRAG-format JSONL (`id`, `question`, `golden_answers`, `metadata`); errors name file and line.

    A row without `id` gets `{dataset}-{line}`; an id seen twice is an error naming both lines. Without
    `dataset`, a question's data set is the name of the folder holding the file, taken from the path made
    absolute (`os.path.abspath`: the working directory for a relative path, `.` and `..` folded, symlinks not
    followed), so `dev.jsonl` run inside `data/hotpotqa/` and `/abs/data/hotpotqa/dev.jsonl` both give
    `hotpotqa`. A row's own `dataset` field wins over either.
    """
    path = Path(path)
    name = dataset if dataset is not None else Path(os.path.abspath(path)).parent.name
    seen = UniqueIds()
    for number, row in iter_jsonl(path, "questions file", MAX_LINE_BYTES):
        where = f"{path}:{number}"
        if "id" not in row:
            row = {**row, "id": f"{name}-{number}"}
        question = question_from_row(row, where, dataset=name)
        seen.add(question.id, where, f"line {number}")
        yield question


def load_questions(path: str | Path, dataset: str | None = None, limit: int | None = None) -> list[Question]:
    questions = []
    for question in iter_questions(path, dataset):
        if limit is not None and len(questions) >= limit:
            break
        questions.append(question)
    return questions
