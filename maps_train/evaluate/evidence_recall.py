"""Evidence recall of a suite's runs: per result row, and per (system, data set) cell of the report.

Each result row of a question with gold passages (see `maps_train.records.evidence` for the layouts, the matching
and what "seen" means per method) gets
    gold_passages            how many gold passages the question has
    evidence_recall          share of them among every hit of every search of its trace
    evidence_recall_seen     share of them among the passages the answer step's input was made from
Rows of questions without gold passages (GPQA, a quarter of NQ) carry none of these. A run whose trace is missing
(a runner of another tool that writes no traces) scores None for both recalls.

Traces keep passage ids only. When some gold passage carries no corpus id (FlashRAG's own HotpotQA/2Wiki/MuSiQue
files), the retrieved passages' titles and texts are read from the system's corpus (`retrieval.corpus`), only for
the ids its traces name; a corpus that is not on this machine (a remote retrieval service) leaves those questions
matched by id alone. A suite shares one `CorpusLookups` across its runs, so each corpus is read once per suite
(then only the rows named, through its offsets), not once per (system, data set) run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from statistics import fmean
from typing import Any

from maps_train.questions import Question
from maps_train.records.evidence import (
    PassageText,
    absent_gold_ids,
    evidence_recall,
    gold_evidence,
    malformed_gold,
    needs_passage_text,
    retrieved_ids,
    seen_ids,
)
from maps_train.records.shards import TRACES_FILE
from maps_train.records.store import read_records
from maps_train.records.trace import TraceFormatError, TraceRecord
from maps_train.retrieval.corpus import Passage, PassageLookup, passages_by_id

RECALL_KEYS = ("evidence_recall", "evidence_recall_seen")


def read_run_traces(run_dir: str | Path) -> dict[str, TraceRecord]:
    """A run's traces by question id ({} when it wrote none; a torn last line skipped); a damaged line is a
    one-line error naming file and line."""
    path = Path(run_dir) / TRACES_FILE
    traces = {}
    for number, row in read_records(path) if path.is_file() else ():
        try:
            trace = TraceRecord.from_dict(row)
        except TraceFormatError as err:
            raise TraceFormatError(f"{path}:{number}: {err}") from None
        traces.setdefault(trace.question_id, trace)
    return traces


def evidence_fields(
    question: Question, trace: TraceRecord | None, passages: Mapping[str, PassageText] | None = None
) -> dict[str, Any]:
    """The evidence columns of one result row; {} when the question has no gold passages."""
    gold = gold_evidence(question.metadata)
    if not gold:
        return {}
    if trace is None:
        return {"gold_passages": len(gold), **dict.fromkeys(RECALL_KEYS)}
    return {
        "gold_passages": len(gold),
        "evidence_recall": evidence_recall(gold, retrieved_ids(trace), passages),
        "evidence_recall_seen": evidence_recall(gold, seen_ids(trace), passages),
    }


class CorpusLookups:
    """One `PassageLookup` per corpus file, shared by every run a suite scores: each corpus is read once per suite
    (on the first run that needs passage text), however many systems and data sets use it."""

    def __init__(self) -> None:
        self._lookups: dict[Path, PassageLookup] = {}
        self._lock = threading.Lock()

    def passages(self, corpus: Path, wanted: Iterable[str]) -> dict[str, Passage]:
        with self._lock:
            lookup = self._lookups.setdefault(corpus.resolve(), PassageLookup(corpus))
        return lookup(wanted)

    def close(self) -> None:
        with self._lock:
            for lookup in self._lookups.values():
                lookup.close()
            self._lookups.clear()


def run_evidence(
    run_dir: str | Path,
    questions: list[Question],
    corpus: str | Path | None = None,
    lookups: CorpusLookups | None = None,
) -> dict[str, dict[str, Any]]:
    """Evidence columns per question id of one finished run (its traces in `run_dir`). `lookups`: the suite's shared
    corpus readers; without them the corpus is scanned for this run alone (`passages_by_id`)."""
    traces = read_run_traces(run_dir)
    local = corpus is not None and Path(corpus).is_file()
    golds = {q.id: gold_evidence(q.metadata) for q in questions}
    corpus_ids: set[str] | None = None  # the gold ids the corpus holds; None: no corpus here to ask
    if local:
        gold_ids = {g.corpus_id for gold in golds.values() for g in gold if g.corpus_id is not None}
        corpus_ids = set(_lookup(Path(corpus), gold_ids, lookups)) if gold_ids else set()
    wanted = set()
    for question in questions:
        trace, gold = traces.get(question.id), golds[question.id]
        absent = corpus_ids is not None and absent_gold_ids(gold, corpus_ids) > 0
        if trace is not None and (needs_passage_text(gold) or absent):  # an absent id may still match by text
            wanted.update(retrieved_ids(trace))
            wanted.update(seen_ids(trace))
    passages: dict[str, Passage] = _lookup(Path(corpus), wanted, lookups) if wanted and local else {}
    fields = {}
    for q in questions:
        row = evidence_fields(q, traces.get(q.id), passages)
        gaps = gold_gaps(q, golds[q.id], corpus_ids)
        fields[q.id] = {**row, **{key: count for key, count in gaps.items() if count}}
    return fields


GAP_KEYS = ("gold_absent", "gold_malformed")  # per result row, when not 0


def gold_gaps(question: Question, gold: list, corpus_ids: set[str] | None) -> dict[str, int]:
    """Gold passages of `question` that cannot be matched as given: ids the corpus does not hold (`gold_absent`,
    only when the corpus is on this machine) and entries of its metadata that name gold but are malformed
    (`gold_malformed`: dropped, so a question whose every gold entry is malformed has no recall at all)."""
    return {"gold_absent": absent_gold_ids(gold, corpus_ids) if corpus_ids is not None else 0,
            "gold_malformed": malformed_gold(question.metadata)}


def gap_warning(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """One line of the gold passages that could not be matched among `rows` (result rows or evidence fields of
    one data set), or None when there are none."""
    rows = list(rows)
    absent, malformed = (sum(int(row.get(key) or 0) for row in rows) for key in GAP_KEYS)
    if not absent and not malformed:
        return None
    questions = sum(1 for row in rows if any(row.get(key) for key in GAP_KEYS))
    return (f"{absent + malformed} gold passages of {questions} questions cannot be matched ({absent} ids absent "
            f"from the corpus, {malformed} malformed gold entries); evidence recall counts absent ones as misses "
            "and leaves malformed ones out")


def _lookup(corpus: Path, wanted: Iterable[str], lookups: CorpusLookups | None) -> dict[str, Passage]:
    return lookups.passages(corpus, wanted) if lookups else passages_by_id(corpus, wanted)


# -- the report's cells ----------------------------------------------------------------------------------------------


def _cell(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    scored = [r for r in rows if r.get("gold_passages")]
    if not scored:
        return None
    cell: dict[str, Any] = {"n": len(scored)}
    for key in RECALL_KEYS:
        values = [float(r[key]) for r in scored if r.get(key) is not None]
        cell[key] = fmean(values) if values else None
    return cell


def evidence_cells(rows: list[dict[str, Any]], systems: list[str], datasets: list[str], avg: str) -> dict[str, Any]:
    """system -> data set (and `avg`, the macro mean over the data sets with gold) -> {n, recalls}; only cells whose
    questions have gold passages."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row["system"], row["dataset"]), []).append(row)
    cells: dict[str, Any] = {}
    for system in systems:
        per_dataset = {}
        for dataset in datasets:
            cell = _cell(grouped.get((system, dataset), []))
            if cell is not None:
                per_dataset[dataset] = cell
        if per_dataset:
            average: dict[str, Any] = {"n": sum(c["n"] for c in per_dataset.values()), "datasets": len(per_dataset)}
            for key in RECALL_KEYS:
                values = [c[key] for c in per_dataset.values() if c[key] is not None]
                average[key] = fmean(values) if values else None
            cells[system] = {**per_dataset, avg: average}
    return cells


__all__ = [
    "GAP_KEYS", "RECALL_KEYS", "CorpusLookups", "evidence_cells", "evidence_fields", "gap_warning", "gold_gaps",
    "read_run_traces", "run_evidence",
]
