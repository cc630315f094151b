"""The six evaluation sets: where each comes from, how it is read, and the paper's seeded sampling.

- NQ, PopQA, 2WikiMultihopQA, HotpotQA, MuSiQue: FlashRAG JSONL (`id`, `question`, `golden_answers`,
  `metadata`), read from a local file with `maps_train.questions.load_questions`, or, for online users, from the
  hub set `RUC-NLPIR/FlashRAG_datasets` (one config per data set, e.g. `nq`, split `test`).
- GPQA Diamond: the official CSV (`Question`, `Correct Answer`, `Incorrect Answer 1`..`3`); the four options are
  shuffled per question with a recorded seed and the gold answer is the letter of the correct one. The CSV must be
  UTF-8 (a leading BOM, as Excel writes it, is dropped so `Record ID` keeps its name); errors name the file line
  where the record starts, which differs from the row number once a quoted cell spans lines.

Every loader rejects a question id seen twice in one data set, naming both places (results are keyed by id), and
checks every question like a JSONL row (`maps_train.questions`: sizes, at most ten options, ids). A CSV header
that names a column twice is refused.

The default local layout is FlashRAG's, `<data_root>/<name>/<split>.jsonl`, which is also the layout of
`../shared/realdata`: `data_root: ../shared/realdata` loads those files as they are.
"""

from __future__ import annotations

import csv
import io
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from maps_train.config.yaml_io import decode_utf8
from maps_train.errors import MapsTrainError, io_errors
from maps_train.questions import Question, UniqueIds, load_questions, question_from_row
from maps_train.records.metrics import LETTERS

FLASHRAG_HUB = "RUC-NLPIR/FlashRAG_datasets"
GPQA_HUB = "Idavidrein/gpqa"  # gated: accept the terms on the hub page first
GPQA_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry knows about a named data set."""

    label: str  # column title in the tables (the paper's)
    split: str  # FlashRAG's split for evaluation
    answer_mode: Literal["short", "choice"]
    format: Literal["flashrag", "gpqa"] = "flashrag"
    hub: str = FLASHRAG_HUB
    hub_config: str | None = None  # defaults to the registry name
    filename: str | None = None  # defaults to <split>.jsonl

    def default_path(self, name: str, data_root: str | Path) -> Path:
        return Path(data_root) / name / (self.filename or f"{self.split}.jsonl")


DATASETS: dict[str, DatasetInfo] = {
    "nq": DatasetInfo("NQ", "test", "short"),
    "popqa": DatasetInfo("PopQA", "test", "short"),
    "2wikimultihopqa": DatasetInfo("2Wiki", "dev", "short"),
    "hotpotqa": DatasetInfo("HotpotQA", "dev", "short"),
    "musique": DatasetInfo("MuSiQue", "dev", "short"),
    "gpqa": DatasetInfo(
        "GPQA", "train", "choice", format="gpqa", hub=GPQA_HUB, hub_config="gpqa_diamond", filename="gpqa_diamond.csv"
    ),
}


def dataset_info(name: str) -> DatasetInfo | None:
    return DATASETS.get(name)


# --- GPQA ---------------------------------------------------------------------------------------------------------

def gpqa_question(row: dict[str, Any], number: int, seed: int, where: str) -> Question:
    """One GPQA row -> a Question whose options are shuffled by `seed` and whose gold answer is a letter.

    The shuffle is seeded per question (seed and question id), so it does not depend on which rows are loaded
    or in what order.
    """
    for column in GPQA_COLUMNS:
        if not str(row.get(column) or "").strip():
            raise MapsTrainError(f"{where}: missing or empty column '{column}'")
    question_id = str(row.get("Record ID") or "").strip() or f"gpqa-{number}"
    correct = str(row["Correct Answer"]).strip()
    options = [correct] + [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
    order = list(range(len(options)))
    random.Random(f"gpqa:{seed}:{question_id}").shuffle(order)
    shuffled = [options[i] for i in order]
    letter = LETTERS[order.index(0)]
    # through the same checks as a JSONL row: the size bounds and the id rules hold for every loader
    fields = {
        "id": question_id,
        "question": str(row["Question"]).strip(),
        "golden_answers": [letter],
        "options": shuffled,
        "metadata": {
            "correct_answer": correct,
            "shuffle_seed": seed,
            "subdomain": row.get("Subdomain"),
            "high_level_domain": row.get("High-level domain"),
        },
    }
    return question_from_row(fields, where, dataset="gpqa")


def iter_csv_records(
    path: Path, required: Sequence[str] = (), header_hint: str = "a header row"
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line where the record starts, header -> cell) for every non-blank record of a UTF-8 CSV file.

    The header is line 1, must name every `required` column and may name a column only once (a record maps
    header -> cell, so a second "Correct Answer" would silently win over the first). Bad bytes, a cell over
    `csv.field_size_limit()` characters, or a record with more cells than the header (a quoting slip) is a
    `MapsTrainError` naming `path:line`; an OS error reading the file is one line naming it.
    """
    with io_errors(path, "read"):
        data = path.read_bytes()
    text = decode_utf8(data, path)
    reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    try:
        header = [name.strip() for name in next(reader, [])]
        _check_unique_header(header, path)
        missing = [column for column in required if column not in header]
        if missing:
            raise MapsTrainError(f"{path}:1: missing column '{missing[0]}' (expected {header_hint})")
        while True:
            start = reader.line_num + 1
            cells = next(reader, None)
            if cells is None:
                return
            if not cells:  # a blank line
                continue
            if len(cells) > len(header):
                raise MapsTrainError(f"{path}:{start}: {len(cells)} cells but the header names {len(header)} columns")
            yield start, dict(zip(header, cells))
    except csv.Error as err:
        line = max(reader.line_num, start)
        if "field larger than field limit" in str(err):
            raise MapsTrainError(
                f"{path}:{line}: a cell is longer than {csv.field_size_limit()} characters (csv.field_size_limit)"
            ) from None
        raise MapsTrainError(f"{path}:{line}: invalid CSV ({err})") from None


def _check_unique_header(header: list[str], path: Path) -> None:
    """Refuse a column named twice; blank names (trailing commas, an unnamed index column) name nothing read."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise MapsTrainError(f"{path}:1: column {name[:80]!r} appears twice in the header")
        if name:
            seen.add(name)


def load_gpqa_csv(path: str | Path, seed: int = 0) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such GPQA CSV (see data/README.md for the official release)")
    questions: list[Question] = []
    seen = UniqueIds()
    records = iter_csv_records(path, GPQA_COLUMNS, "the official GPQA CSV header")
    for number, (line, row) in enumerate(records, start=1):
        where = f"{path}:{line}"
        question = gpqa_question(row, number, seed, where)
        seen.add(question.id, where, f"line {line}")
        questions.append(question)
    return questions


# --- hub ----------------------------------------------------------------------------------------------------------

def _offline() -> bool:
    return any(os.environ.get(v, "0").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def load_hub_rows(hub: str, config: str, split: str, name: str) -> Iterable[dict[str, Any]]:
    if _offline():
        raise MapsTrainError(
            f"dataset '{name}': hub set {hub} ({config}/{split}) needs the network but HF_HUB_OFFLINE is set; "
            f"download it (data/README.md) and give `path:` instead"
        )
    try:
        import datasets

        return datasets.load_dataset(hub, config, split=split)
    except Exception as err:  # noqa: BLE001  (the hub raises many types; the user needs one line)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MapsTrainError(f"dataset '{name}': could not load {hub} ({config}/{split}): {first}") from None


# --- one entry point ----------------------------------------------------------------------------------------------

def load_eval_questions(
    name: str,
    path: str | Path | None = None,
    hub: str | None = None,
    split: str | None = None,
    seed: int = 0,
    data_root: str | Path = "data",
    config: str | None = None,
) -> list[Question]:
    """All questions of one data set, from `path`, else the hub set `hub`, else `<data_root>/<name>/<split>.jsonl`.

    `seed` is used by GPQA's option shuffle (sampling is separate: `sample`). Names outside the registry need a
    path or hub and load as FlashRAG JSONL (GPQA format when the path ends in .csv).
    """
    info = dataset_info(name)
    split = split or (info.split if info else "test")
    is_gpqa = (info is not None and info.format == "gpqa") or (path is not None and str(path).endswith(".csv"))
    if path is None and hub is None:
        if info is None:
            raise MapsTrainError(
                f"dataset '{name}': not a known data set ({', '.join(DATASETS)}); give `path:` or `hub:`"
            )
        path = info.default_path(name, data_root)
        if not Path(path).is_file():
            raise MapsTrainError(
                f"dataset '{name}': {path} not found; put the file there (data/README.md), set `path:`, or set "
                f"`hub: {info.hub}` to download it"
            )
    if path is not None:
        questions = load_gpqa_csv(path, seed) if is_gpqa else load_questions(path, dataset=name)
    else:
        hub_config = config or (info.hub_config if info and info.hub_config else name)
        rows = load_hub_rows(hub, hub_config, split, name)
        questions = _hub_questions(rows, f"{hub}:{hub_config}/{split}", name, is_gpqa, seed)
    return [q if q.dataset == name else replace(q, dataset=name) for q in questions]


def _hub_questions(
    rows: Iterable[dict[str, Any]], source: str, name: str, is_gpqa: bool, seed: int
) -> list[Question]:
    """Hub rows as checked Questions; errors name `hub:config/split[row]`."""
    questions = []
    seen = UniqueIds()
    for number, row in enumerate(rows, 1):
        where = f"{source}[{number}]"
        if is_gpqa:
            question = gpqa_question(dict(row), number, seed, where)
        else:
            question = Question.from_dict(_with_id(dict(row), name, number), dataset=name, where=where)
        seen.add(question.id, where, f"row {number}")
        questions.append(question)
    return questions


def _with_id(row: dict[str, Any], name: str, number: int) -> dict[str, Any]:
    return row if row.get("id") not in (None, "") else {**row, "id": f"{name}-{number}"}


# --- the paper's sampling protocol --------------------------------------------------------------------------------

def sample(questions: list[Question], n: int | None, seed: int) -> list[Question]:
    """`n` questions drawn at random with `seed` (all of them when `n` is None or at least the set's size).

    A seeded permutation of the whole set, cut to its first `n`: deterministic, and nested (the 50-question
    sample of a seed is the start of its 1,000-question sample, so a smoke run's answers are reused by the full
    run). Each returned question records `metadata["sample"] = {"seed", "n", "population"}`.
    """
    order = list(range(len(questions)))
    random.Random(seed).shuffle(order)
    if n is not None:
        order = order[: max(n, 0)]
    record = {"seed": seed, "n": len(order), "population": len(questions)}
    return [replace(questions[i], metadata={**questions[i].metadata, "sample": record}) for i in order]
