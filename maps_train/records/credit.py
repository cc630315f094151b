"""Credit per role: what each call of a trace contributed towards the question's gold passages and answer.

An outcome (the final answer right or wrong) says nothing about which of a question's ten or twenty calls earned
it. Where the question names its gold passages (`records.evidence.gold_evidence`: by corpus id, else by
FlashRAG-normalised title and text), each call can be credited on its own:

- every searched sub-query (`queries`): the gold passages its hits held, and how many of them no earlier search of
  the question had found (`new`): a query that re-finds known gold adds nothing;
- a writer call: the same over the sub-queries it wrote (MAPS: the i-th writer call of a round wrote the round's
  i-th sub-query; the no-directions ablation's one writer call wrote them all);
- a proposer call: the same over the sub-queries written for its directions (the round's);
- with `agent.search_question`, round 1's first search is the question itself: it is credited as a search (its
  gold counts as found), no call wrote it, and the writers and proposer after it are credited with the gold it
  missed;
- a consolidator call: whether it stopped (`sufficient`) or went on, whether the gold found by the searches so far
  (this round's included: the evidence it read) was complete, how many gold passages the later rounds found
  (`later_new`), and whether the decision was right: stop when the gold is complete; go on when it is not and the
  rounds that followed found more of it. A go-on that found nothing more was wrong: it bought rounds and no
  evidence (version 1 called every go-on with gold missing right, and RL on it learned to search to the last
  round, docs/learning-study.md). A go-on that no round followed (the round cap ended the run) and a question
  without gold passages leave `right` null;
- the answer call: Cover-EM, EM and F1 of the final answer (letter accuracy for a choice question).

A writer's or proposer's entry names the positions of its sub-queries in their round (`positions`), so RL can
search them again deeper and grade the find by rank (`rank_credit`, `rl.reward.process_depth`): at 135M over BM25
a writer rarely finds gold its question missed, too rare a reward for a group of four to differ on
(docs/learning-study.md).

The credit is computed when a trace is written (`agents.engine`, which knows the question's metadata and the
retrieved passages' text) and stored in `TraceRecord.credit`, one entry per call in `TraceRecord.all_calls()`
order, so `sft-data`, `rl` and `analyze` read it from the trace alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from maps_train.records.evidence import GoldPassage, PassageText, found
from maps_train.records.metrics import score_answer
from maps_train.records.trace import QUESTION_SEARCHED, RoleCall, TraceRecord

CREDIT_VERSION = 2  # 2: a go-on is right only when later rounds found more gold
SEARCH_ROLES = ("writer",)  # the roles whose calls write sub-queries
DIRECTION_ROLES = ("proposer",)


def _hits_gold(gold: Sequence[GoldPassage], passage_ids: Sequence[str], passages: Mapping[str, PassageText]) -> set[int]:
    """Indices of the gold passages among `passage_ids`."""
    return {i for i, g in enumerate(gold) if found(g, passage_ids, passages)}


def compute_credit(trace: TraceRecord, gold: Sequence[GoldPassage],
                   passages: Mapping[str, PassageText] | None = None) -> dict[str, Any]:
    """The credit of every search and call of `trace` against `gold` (see the module docstring)."""
    passages = passages or {}
    known: set[int] = set()  # gold found by the searches so far, in search order
    queries: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    decisions: list[tuple[dict[str, Any], int, bool]] = []  # (entry, gold known then, a later round followed)
    last_round = trace.rounds[-1].index if trace.rounds else None
    for round_ in trace.rounds:
        round_queries = []
        for position, hits in enumerate(round_.retrieved):
            hit_gold = _hits_gold(gold, hits.passage_ids, passages)
            new = hit_gold - known
            known |= hit_gold
            entry = {"round": round_.index, "position": position, "gold": sorted(hit_gold), "new": len(new)}
            queries.append(entry)
            round_queries.append(entry)
        # The question's own search (agent.search_question) came first and no call wrote it: the writers and the
        # proposer are credited only with the gold it missed.
        written = round_queries[1:] if round_.extra.get(QUESTION_SEARCHED) else round_queries
        writers = [call for call in round_.calls if call.role in SEARCH_ROLES]
        writer_queries = _writer_queries(writers, written)
        for call in round_.calls:
            if call.role in SEARCH_ROLES:
                calls.append(_search_credit(call, round_.index, writer_queries.pop(0)))
            elif call.role in DIRECTION_ROLES:
                calls.append(_search_credit(call, round_.index, written))
            elif call.role == "consolidator":
                calls.append(_decision_credit(call, round_.index, round_.sufficient, len(known), len(gold)))
                decisions.append((calls[-1], len(known), round_.index != last_round))
            else:
                calls.append({"role": call.role, "round": round_.index})
    if trace.final_call is not None:
        calls.append({"role": trace.final_call.role, "round": 0, **answer_scores(trace)})
    for entry, known_then, followed in decisions:
        _judge_decision(entry, len(known) - known_then, followed)
    return {"version": CREDIT_VERSION, "gold": len(gold), "found": len(known), "queries": queries, "calls": calls}


def _writer_queries(writers: list[RoleCall], round_queries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The round's sub-queries each writer call wrote: one each when there are as many calls as queries (MAPS),
    all of them for one call (the no-directions ablation), else none (a method whose calls and searches do not
    pair)."""
    if len(writers) == len(round_queries):
        return [[entry] for entry in round_queries]
    if len(writers) == 1:
        return [list(round_queries)]
    return [[] for _ in writers]


def _search_credit(call: RoleCall, round_index: int, entries: list[dict[str, Any]]) -> dict[str, Any]:
    hit_gold = sorted({g for entry in entries for g in entry["gold"]})
    return {"role": call.role, "round": round_index, "queries": len(entries), "gold": hit_gold,
            "new": sum(entry["new"] for entry in entries), "positions": [entry["position"] for entry in entries]}


def gold_known_before(credit: Mapping[str, Any], round_index: int, position: int) -> set[int]:
    """The gold passages (indices) the searches before the `position`-th of round `round_index` had found, in the
    credit's search order (`queries`): what a search there could still find new."""
    known: set[int] = set()
    for entry in credit.get("queries") or []:
        if (entry["round"], entry["position"]) >= (round_index, position):
            break
        known |= set(entry["gold"])
    return known


def rank_credit(gold: Sequence[GoldPassage], known: set[int], ranked: Sequence[Sequence[str]],
                passages: Mapping[str, PassageText] | None = None) -> float:
    """A search call's find graded by rank: each gold passage not in `known` scores 1 / log2(1 + r) at the best
    rank r (1-based) it holds in any of `ranked` (each query's passage ids, best first, searched deeper than the
    agent's top-k), 0 where none holds it; the sum over the question's gold passages divided by their number.

    A gold passage retrieved at rank 1 scores 1, at rank 5 0.39, at rank 100 0.15: a query that brings a missing
    passage from nowhere to rank 30 is paid a little, where the found-new credit (top-k only) pays it nothing.
    This is DCG's rank discount with a gain of 1 a passage, so it reads in the same units as `new / gold`."""
    if not gold:
        return 0.0
    passages = passages or {}
    score = 0.0
    for index, passage in enumerate(gold):
        if index in known:
            continue
        ranks = [rank for ids in ranked for rank, pid in enumerate(ids, 1) if found(passage, [pid], passages)]
        if ranks:
            score += 1.0 / math.log2(1 + min(ranks))
    return score / len(gold)


def _decision_credit(call: RoleCall, round_index: int, sufficient: bool | None, known: int,
                     total: int) -> dict[str, Any]:
    """The decision as made; `_judge_decision` adds what the later rounds found and whether it was right."""
    return {"role": call.role, "round": round_index, "stopped": bool(sufficient), "parsed": call.parse_ok,
            "covered": known / total if total else None, "complete": (known == total) if total else None}


def _judge_decision(entry: dict[str, Any], later_new: int, followed: bool) -> None:
    """Stop is right with the gold complete; go on is right with it incomplete and found more by the later rounds;
    null without gold, or for a go-on no round followed (nothing shows what it would have found)."""
    entry["later_new"] = later_new
    if entry["complete"] is None or (not entry["stopped"] and not followed):
        entry["right"] = None
    elif entry["stopped"]:
        entry["right"] = entry["complete"]
    else:
        entry["right"] = not entry["complete"] and later_new > 0


def answer_scores(trace: TraceRecord) -> dict[str, float]:
    """Cover-EM, EM and F1 of the trace's final answer (`metrics.score_answer`, evaluation's scoring)."""
    mode = "choice" if trace.options else "short"
    scores = score_answer(trace.final_answer, trace.golden_answers, mode, trace.options)
    return {"cover_em": scores["cover_em"], "em": scores["em"], "f1": round(scores["f1"], 6)}


def call_credits(trace: TraceRecord) -> list[tuple[RoleCall, dict[str, Any] | None]]:
    """Each call of `trace` (`all_calls()` order) with its credit; None for every call of a trace written without
    credit, or whose credit does not pair with its calls (a hand-edited trace)."""
    calls = trace.all_calls()
    entries = (trace.credit or {}).get("calls")
    if not isinstance(entries, list) or len(entries) != len(calls):
        return [(call, None) for call in calls]
    return [(call, entry if entry.get("role") == call.role else None) for call, entry in zip(calls, entries)]


def has_gold(trace: TraceRecord) -> bool:
    return bool(trace.credit) and int(trace.credit.get("gold", 0)) > 0


__all__ = ["CREDIT_VERSION", "answer_scores", "call_credits", "compute_credit", "has_gold"]
