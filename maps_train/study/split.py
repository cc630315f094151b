"""The learning study's train/dev split of real questions, by a fixed seed, written down.

Each data set's source file is shuffled by `random.Random(seed)` over its rows in file order; the first `dev` rows
are dev, the next `train` rows train (a data set with a train file of its own, 2WikiMultihopQA's
`train_sample.jsonl`, draws its train rows from that file instead). Dev questions are never trained on: the split
checks that no id and no question text is on both sides. Only questions with gold passages are drawn (evidence
recall is the study's first measure). The rows are written as they are, with their `dataset` set, to
`<out>/train.jsonl` (one file, every data set) and `<out>/dev/<dataset>.jsonl`, and `<out>/split.json` records the
seed, the sources and every id on each side. The data stay where they are (`../shared/realdata`): the split is
written under the run folder, never into the project.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl
from maps_train.paths import write_text_atomic
from maps_train.questions import MAX_LINE_BYTES
from maps_train.records.evidence import gold_evidence

SPLIT_FILE = "split.json"


@dataclass(frozen=True)
class SplitSource:
    dataset: str
    dev_file: str  # relative to the data root
    train_file: str | None = None  # None: train rows come from dev_file, after the dev rows


# HotpotQA, 2Wiki, MuSiQue and NQ, as ../shared/realdata holds them.
SOURCES = (
    SplitSource("hotpotqa", "hotpotqa/dev.jsonl"),
    SplitSource("2wikimultihopqa", "2wikimultihopqa/dev.jsonl", "2wikimultihopqa/train_sample.jsonl"),
    SplitSource("musique", "musique/dev.jsonl"),
    SplitSource("nq", "nq/test.jsonl"),
)


def _rows_with_gold(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such questions file (the study reads ../shared/realdata; see --data-root)")
    rows = [row for _, row in iter_jsonl(path, "questions file", MAX_LINE_BYTES)]
    return [row for row in rows if gold_evidence(row.get("metadata"))]


def _shuffled(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return rows


def draw_split(data_root: str | Path, *, dev: int, train: int, seed: int = 0,
               sources: tuple[SplitSource, ...] = SOURCES) -> tuple[dict[str, Any], dict[str, list], list]:
    """The split, drawn and checked, nothing written: (what `split.json` holds, dev rows per data set, train rows).
    A one-line error when a source has too few questions for the sizes asked."""
    root = Path(data_root)
    if dev < 1 or train < 1:
        raise MapsTrainError(f"--dev {dev} --train {train}: a study needs at least 1 dev and 1 train question per "
                             "data set")
    record: dict[str, Any] = {"seed": seed, "dev_per_dataset": dev, "train_per_dataset": train, "sources": {},
                              "dev": {}, "train": {}}
    dev_sets: dict[str, list[dict[str, Any]]] = {}
    train_rows: list[dict[str, Any]] = []
    for source in sources:
        dev_pool = _shuffled(_rows_with_gold(root / source.dev_file), seed)
        dev_rows = dev_pool[:dev]
        train_pool = _shuffled(_rows_with_gold(root / source.train_file), seed) if source.train_file else dev_pool[dev:]
        dev_keys = {str(row["id"]) for row in dev_rows} | {row["question"].strip().lower() for row in dev_rows}
        picked = [row for row in train_pool
                  if str(row["id"]) not in dev_keys and row["question"].strip().lower() not in dev_keys][:train]
        if len(dev_rows) < dev or len(picked) < train:
            raise MapsTrainError(f"{root / source.dev_file}: {len(dev_rows)} dev and {len(picked)} train questions "
                                 f"with gold passages, fewer than the {dev} and {train} asked for")
        for row in dev_rows + picked:
            row["dataset"] = source.dataset
        dev_sets[source.dataset] = dev_rows
        train_rows += picked
        record["sources"][source.dataset] = {"dev": source.dev_file, "train": source.train_file or source.dev_file}
        record["dev"][source.dataset] = [str(row["id"]) for row in dev_rows]
        record["train"][source.dataset] = [str(row["id"]) for row in picked]
    return record, dev_sets, train_rows


def split_questions(data_root: str | Path, out: str | Path, *, dev: int, train: int, seed: int = 0,
                    sources: tuple[SplitSource, ...] = SOURCES) -> dict[str, Any]:
    """Write the split (see the module docstring); returns what `split.json` holds. Rerun with the same settings,
    it writes the same files. Nothing is written unless every source can give the sizes asked."""
    out = Path(out)
    record, dev_sets, train_rows = draw_split(data_root, dev=dev, train=train, seed=seed, sources=sources)
    for dataset, rows in dev_sets.items():
        _write_jsonl(out / "dev" / f"{dataset}.jsonl", rows)
    _write_jsonl(out / "train.jsonl", train_rows)
    write_text_atomic(out / SPLIT_FILE, json.dumps(record, indent=1) + "\n")
    return record


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


__all__ = ["SOURCES", "SPLIT_FILE", "SplitSource", "draw_split", "split_questions"]
