"""Sub-query sequences: a question and its ordered rounds of sub-queries, from files or agent traces.

Four sources give the same record:
- JSONL rows `{"id", "question", "subqueries": [...]}` (or `"rounds"`), where each item is one round: a string
  (one sub-query) or a list of strings (a round with several parallel sub-queries);
- MuSiQue rows whose `metadata.question_decomposition` lists the gold sub-questions in order (one per round),
  or demo-world rows with `metadata.decomposition` (strings) and `metadata.decomposition_answers`;
- a run's `traces.jsonl` (rows with `schema_version`): the rounds `trace_reader` finds searched;
- any iterable, or callable returning one, of `(question, [[round-1 sub-queries], [round-2 ...]])` pairs.

MuSiQue sub-questions refer to earlier answers as `#1`, `#2` and many are relation triples (`X >> capital`);
`references` and `relations` choose how that text is embedded (see `MUSIQUE_*` below).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from maps_train.analysis.gold import gold_passages
from maps_train.analysis.trace_reader import read_traces, searched_rounds
from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl
from maps_train.records.trace import TraceRecord

# keep: "#1 >> capital" as written; answer: "#1" replaced by the gold answer of sub-question 1.
References = Literal["keep", "answer"]
# keep: "X >> capital" as written; rewrite: "the capital of X".
Relations = Literal["keep", "rewrite"]

_REFERENCE = re.compile(r"#(\d+)")


@dataclass
class SubquerySequence:
    id: str
    question: str
    rounds: list[list[str]]  # rounds[t-1] = the sub-queries of round t (one or several)
    evidence: list[str] = field(default_factory=list)  # gold passages ("title\ntext") when known
    dataset: str = ""

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)


def clean_rounds(rounds: list[list[str]]) -> list[list[str]]:
    # A round with no sub-query ends the sequence: later rounds have no defined q_t before them.
    cleaned = []
    for round_queries in rounds:
        queries = [q.strip() for q in round_queries if isinstance(q, str) and q.strip()]
        if not queries:
            break
        cleaned.append(queries)
    return cleaned


def sequence_from_trace(
    trace: TraceRecord, evidence: Iterable[str] = (), include_question_searches: bool = False
) -> SubquerySequence:
    """The sequence of sub-queries one trace searched (see `trace_reader` for which rounds count)."""
    rounds = clean_rounds(searched_rounds(trace, include_question_searches))
    return SubquerySequence(trace.question_id, trace.question, rounds, list(evidence), dataset=trace.dataset)


def read_trace_sequences(path: str | Path, include_question_searches: bool = False) -> list[SubquerySequence]:
    """Sequences (no gold evidence: traces do not carry question metadata) from a traces file."""
    return [sequence_from_trace(t, (), include_question_searches) for t in read_traces(path)]


def musique_subquery(text: str, answers: list[str], references: References, relations: Relations) -> str:
    """One MuSiQue sub-question as embedded: references and relation triples rendered as chosen."""
    if references == "answer":

        def substitute(match: re.Match) -> str:
            index = int(match.group(1)) - 1
            return answers[index] if 0 <= index < len(answers) else match.group(0)

        text = _REFERENCE.sub(substitute, text)
    if relations == "rewrite" and ">>" in text:
        subject, _, relation = text.partition(">>")
        text = f"the {relation.strip()} of {subject.strip()}"
    return " ".join(text.split())


def _rounds_from_row(row: dict[str, Any], where: str, references: References, relations: Relations) -> list[list[str]]:
    items = row.get("subqueries", row.get("rounds"))
    if items is not None:
        if not isinstance(items, list):
            raise MapsTrainError(f"{where}: field 'subqueries' must be a list of strings or of lists of strings")
        rounds = []
        for item in items:
            if isinstance(item, str):
                rounds.append([item])
            elif isinstance(item, list) and all(isinstance(q, str) for q in item):
                rounds.append(list(item))
            else:
                raise MapsTrainError(f"{where}: field 'subqueries' holds {type(item).__name__}; want str or list[str]")
        return rounds
    metadata = row.get("metadata") or {}
    decomposition = metadata.get("question_decomposition", row.get("question_decomposition"))
    if decomposition is None and isinstance(metadata.get("decomposition"), list):
        # The demo world's layout: sub-questions as strings, their answers beside them.
        answers = metadata.get("decomposition_answers") or []
        decomposition = [
            {"question": q, "answer": answers[i] if i < len(answers) else ""}
            for i, q in enumerate(metadata["decomposition"])
        ]
    if decomposition is None:
        raise MapsTrainError(
            f"{where}: no 'subqueries', 'rounds', 'metadata.question_decomposition' or 'metadata.decomposition' field"
        )
    if not isinstance(decomposition, list) or not all(isinstance(d, dict) and "question" in d for d in decomposition):
        raise MapsTrainError(f"{where}: 'question_decomposition' must be a list of objects with a 'question' field")
    answers = [str(d.get("answer", "")) for d in decomposition]
    return [[musique_subquery(str(d["question"]), answers, references, relations)] for d in decomposition]


def load_sequences(
    path: str | Path, references: References = "keep", relations: Relations = "keep"
) -> list[SubquerySequence]:
    """Sequences from a JSONL file of sub-query rows or MuSiQue rows (detected per row)."""
    if references not in ("keep", "answer"):
        raise MapsTrainError(f"references '{references}': want keep or answer")
    if relations not in ("keep", "rewrite"):
        raise MapsTrainError(f"relations '{relations}': want keep or rewrite")
    path = Path(path)
    sequences = []
    for index, (number, row) in enumerate(iter_jsonl(path)):
        where = f"{path}:{number}"
        if index == 0 and "schema_version" in row:  # an agent's traces.jsonl, not sub-query rows
            return read_trace_sequences(path)
        if not isinstance(row.get("question"), str):
            raise MapsTrainError(f"{where}: missing field 'question'")
        rounds = clean_rounds(_rounds_from_row(row, where, references, relations))
        metadata = row.get("metadata") or {}
        evidence = gold_passages(metadata)
        dataset = str(row.get("dataset") or metadata.get("dataset") or "")
        sequences.append(SubquerySequence(str(row.get("id", number)), row["question"], rounds, evidence, dataset))
    return sequences


def sequences_from_pairs(
    pairs: Iterable[tuple[str, list[list[str]]]] | Callable[[], Iterable[tuple[str, list[list[str]]]]],
) -> list[SubquerySequence]:
    """Sequences from `(question, [[round-1 sub-queries], ...])` pairs (e.g. read from agent traces).

    A pair may carry a third item, the id; otherwise ids are the pair's position.
    """
    if callable(pairs):
        pairs = pairs()
    sequences = []
    for index, pair in enumerate(pairs):
        if len(pair) == 3:
            question, rounds, seq_id = pair
        elif len(pair) == 2:
            (question, rounds), seq_id = pair, index
        else:
            raise MapsTrainError(f"trace pair {index}: want (question, rounds) or (question, rounds, id)")
        if not isinstance(question, str) or not isinstance(rounds, list):
            raise MapsTrainError(f"trace pair {index}: question must be str and rounds a list of lists of str")
        rounds = [[r] if isinstance(r, str) else list(r) for r in rounds]
        sequences.append(SubquerySequence(str(seq_id), question, clean_rounds(rounds)))
    return sequences
