"""The sub-queries a method actually searched, round by round, read from its `traces.jsonl`.

Every engine records, per round, the queries that reached the retriever in `RoundRecord.retrieved` (one
`SubQueryHits` per query, in order) and nothing there for a turn that did not search: a Search-o1 turn whose query
was refused (repeated, over the limit), a ParallelSearch or s3 step without a valid query, a final answer turn.
So one rule reads every method: a round is a searched round when `retrieved` is not empty, and its sub-queries
are the `retrieved` queries. What differs per method is which searches the method WROTE:

- `maps` (and its ablations, which run as method `maps` with switches: no directions, one direction, coupled
  prompts): every round's N sub-queries, written by the writer; with `agent.search_question`, round 1 first
  searches the question text (`extra.question_searched`), left out like vanilla's below.
- `search_o1`: one query per searching turn (`extra.action == "search"`).
- `parallel_search`: the `##`-separated sub-queries of each search call, one round per call.
- `s3`: round 1 is the engine's initial retrieval with the question text itself, then one query per searching
  step.
- `vanilla`: one retrieval with the question text; no sub-query of its own.

A search with the question text verbatim (vanilla's, s3's initial one) is not a sub-query the method wrote: its
q_t equals q_0, a zero move. The readers leave it out unless `include_question_searches` (then the number of
rounds read equals the record's `retrieval_rounds`).

`analysis.sequences` turns these rounds into `SubquerySequence`s (`sequence_from_trace`, `read_trace_sequences`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.records.trace import QUESTION_SEARCHED, RoundRecord, TraceRecord, iter_traces

# Per method: is this searched round a search of the question text itself (not a written sub-query)?
QuestionSearch = Callable[[RoundRecord], bool]


def _never(round_: RoundRecord) -> bool:
    return False


QUESTION_SEARCHES: dict[str, QuestionSearch] = {
    "maps": _never,
    "search_o1": _never,
    "parallel_search": _never,
    "s3": lambda round_: round_.extra.get("action") == "initial_search",
    "vanilla": lambda round_: True,
}


def written_queries(round_: RoundRecord) -> list[str]:
    """The queries a round sent to the retriever, less MAPS's `agent.search_question` search of the question text
    (round 1's first search): those a model wrote."""
    queries = [hit.query for hit in round_.retrieved]
    return queries[1:] if round_.extra.get(QUESTION_SEARCHED) else queries


def searched_rounds(trace: TraceRecord, include_question_searches: bool = False) -> list[list[str]]:
    """The trace's searched rounds in order, each the list of queries sent to the retriever."""
    # An unknown method (a new engine) is read by the shared rule, every searched round kept.
    is_question_search = QUESTION_SEARCHES.get(trace.method, _never)
    rounds = []
    for round_ in trace.rounds:
        queries = [hit.query for hit in round_.retrieved] if include_question_searches else written_queries(round_)
        if not queries:
            continue
        if not include_question_searches and is_question_search(round_):
            continue
        rounds.append(queries)
    return rounds


def iter_valid_traces(path: str | Path) -> Iterator[TraceRecord]:
    """Every trace of a `traces.jsonl`, in order; the first bad line is an error naming file and line."""
    for _, record in iter_traces(path):
        if isinstance(record, Exception):
            raise MapsTrainError(str(record))
        yield record


def read_traces(path: str | Path) -> list[TraceRecord]:
    """Every trace of a `traces.jsonl`; the first bad line is an error naming file and line."""
    return list(iter_valid_traces(path))
