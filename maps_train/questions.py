"""The question record every method answers and every dataset loader yields (FlashRAG JSONL convention)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl


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
    def from_dict(cls, row: dict[str, Any], dataset: str = "") -> Question:
        return cls(
            id=str(row["id"]),
            question=str(row["question"]),
            golden_answers=[str(a) for a in row.get("golden_answers") or []],
            options=row.get("options"),
            dataset=row.get("dataset") or dataset,
            metadata=row.get("metadata") or {},
        )


def iter_questions(path: str | Path, dataset: str | None = None) -> Iterator[Question]:
    """Read FlashRAG-format JSONL (`id`, `question`, `golden_answers`, `metadata`); errors name file and line."""
    path = Path(path)
    name = dataset if dataset is not None else path.parent.name
    for number, row in iter_jsonl(path, "questions file"):
        if "question" not in row:
            raise MapsTrainError(f"{path}:{number}: missing field 'question'")
        if "id" not in row:
            row = {**row, "id": f"{name}-{number}"}
        yield Question.from_dict(row, dataset=name)


def load_questions(path: str | Path, dataset: str | None = None, limit: int | None = None) -> list[Question]:
    questions = []
    for question in iter_questions(path, dataset):
        if limit is not None and len(questions) >= limit:
            break
        questions.append(question)
    return questions
