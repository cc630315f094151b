"""A branch search call's find graded by rank (`rl.reward.process_depth`), written into its trace's credit.

The found-new credit (`records.credit`) pays a writer only for gold that lands in the agent's top k: at 135M over
BM25, with the question searched first, few writer calls do, so almost every group of four branches ties at 0
and GRPO has nothing to compare. Searched deeper, many more of the calls with gold left to find bring some of it
closer (docs/learning-study.md has the figures). This searches the branch call's own sub-queries again, `depth` deep, with the
rollout's retriever, and stores `records.credit.rank_credit` in the call's credit entry, where the process reward
reads it. Only the branch call is graded: it is the one call a group's branches differ by.
"""

from __future__ import annotations

from collections.abc import Sequence

from maps_train.questions import Question
from maps_train.records.credit import DIRECTION_ROLES, SEARCH_ROLES, gold_known_before, rank_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import TraceRecord
from maps_train.retrieval.base import Retriever
from maps_train.rl.rewards import RANK_CREDIT, branch_of


def grade_branch_search(trace: TraceRecord, question: Question, trained_roles: Sequence[str], branch_call: int,
                        retriever: Retriever, depth: int) -> float | None:
    """Write the rank-graded find of the rollout's branch call into its credit and return it; None (nothing
    written) for a call that searches nothing (a consolidator's, the answer's) or a question without gold. A
    search call that wrote no sub-query (its output did not parse) is graded 0."""
    branch = branch_of(trace, trained_roles, branch_call)
    gold = gold_evidence(question.metadata)
    if branch is None or branch[1] is None or not gold:
        return None
    call, entry = branch
    if call.role not in SEARCH_ROLES + DIRECTION_ROLES:
        return None
    positions = entry.get("positions") or []
    round_ = next((r for r in trace.rounds if r.index == entry["round"]), None)
    if not positions or round_ is None:
        entry[RANK_CREDIT] = 0.0
        return 0.0
    queries = [round_.retrieved[position].query for position in positions]
    results = retriever.search(queries, depth)
    passages = {hit.id: hit for hits in results for hit in hits}
    known = gold_known_before(trace.credit or {}, entry["round"], positions[0])
    entry[RANK_CREDIT] = round(rank_credit(gold, known, [[hit.id for hit in hits] for hits in results], passages), 6)
    return entry[RANK_CREDIT]
