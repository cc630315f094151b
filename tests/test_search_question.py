"""`agent.search_question`: MAPS's round 1 also searches the question itself, first. On a real BM25 index over the
realdata corpus, the question's own search finds the gold passage the scripted sub-queries miss; the trace records
it apart from what the writer wrote; credit gives the writers and proposer only the gold it missed (counted by
hand); the momentum readers leave it out; the config digest tells the two settings apart."""

from __future__ import annotations

import json

from scripted_backend import ScriptedBackend, consolidator_sufficient_after

from maps_train.agents.runner import run_method
from maps_train.analysis.trace_reader import searched_rounds
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.credit import call_credits, compute_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import (
    QUESTION_SEARCHED,
    CallUsage,
    RoleCall,
    RoundRecord,
    SubQueryHits,
    TraceRecord,
    iter_traces,
)


def call(role: str) -> RoleCall:
    return RoleCall(role=role, messages=[{"role": "user", "content": role}], raw_text="{}", parsed={}, parse_ok=True,
                    usage=CallUsage())


def first_passage_question(short_corpus) -> Question:
    """A question about the corpus's first passage (Jeff Porcaro), that passage its gold."""
    row = json.loads(short_corpus.read_text(encoding="utf-8").splitlines()[0])
    title, _, text = row["contents"].partition("\n")
    return Question(id="q1", question=f"Which band was {title} the drummer of?", golden_answers=["Toto"],
                    metadata={"supporting_paragraphs": [{"title": title, "text": text, "corpus_id": row["id"]}]})


class Searched:
    """The real BM25 retriever, with the queries it was sent kept in order."""

    def __init__(self, retriever):
        self.retriever, self.queries = retriever, []

    def search(self, queries, k):
        self.queries.extend(queries)
        return self.retriever.search(queries, k)


def run(tmp_path, bm25, question, *overrides):
    recipe = load_recipe(None, ["agent.num_directions=2", "agent.max_rounds=2", "agent.top_k=3", *overrides])
    backend = ScriptedBackend({"consolidator": consolidator_sufficient_after(2)})  # scripted queries: no gold
    retriever = Searched(bm25)
    run_method(recipe, [question], tmp_path, backend=backend, retriever=retriever, progress=False)
    [(_, trace)] = list(iter_traces(tmp_path / "traces.jsonl"))
    return trace, retriever.queries


def test_round_one_searches_the_question_first_on_a_real_bm25_index(bm25, short_corpus, tmp_path):
    question = first_passage_question(short_corpus)
    on, sent_on = run(tmp_path / "on", bm25, question, "agent.search_question=true")
    off, sent_off = run(tmp_path / "off", bm25, question)
    # What reached the retriever: the question once, first, then what the writers wrote, as without the option.
    assert sent_on == [question.question, *sent_off] and question.question not in sent_off
    first, second = on.rounds
    assert first.extra[QUESTION_SEARCHED] is True and QUESTION_SEARCHED not in second.extra
    assert [hits.query for hits in first.retrieved] == first.sub_queries
    assert first.sub_queries[0] == question.question and len(first.sub_queries) == 3
    assert len(second.sub_queries) == 2 and question.question not in second.sub_queries
    assert first.sub_queries[1:] == off.rounds[0].sub_queries  # the writers wrote the same
    # BM25 finds the gold for the question; the scripted sub-queries never do.
    assert on.credit["queries"][0]["gold"] == [0] and (on.credit["found"], off.credit["found"]) == (1, 0)
    assert on.cost.retrievals == off.cost.retrievals + 1 and on.cost.calls == off.cost.calls
    # No call wrote the question's search: the writers and the proposer are credited with none of it.
    credits = call_credits(on)
    assert all(entry["new"] == 0 for call, entry in credits if call.role in ("writer", "proposer"))
    assert [entry["queries"] for call, entry in credits if call.role == "proposer"] == [2, 2]
    # The momentum readers take only what the writers wrote, unless asked for the question's searches too.
    assert searched_rounds(on) == searched_rounds(off)
    assert searched_rounds(on, include_question_searches=True)[0][0] == question.question
    assert on.config_digest != off.config_digest


def test_credit_after_the_question_search_counted_by_hand():
    gold = gold_evidence({"supporting_paragraphs": [
        {"title": "A", "text": "a", "corpus_id": "p1"}, {"title": "B", "text": "b", "corpus_id": "p2"}]})
    # The question found p1; writer 1 re-found p1 and found p2; writer 2 found nothing.
    round_ = RoundRecord(index=1, calls=[call("proposer"), call("writer"), call("writer"), call("consolidator")],
                         sub_queries=["the question", "w1", "w2"],
                         retrieved=[SubQueryHits("the question", ["p1", "p9"]), SubQueryHits("w1", ["p1", "p2"]),
                                    SubQueryHits("w2", ["p8"])],
                         sufficient=True, extra={QUESTION_SEARCHED: True})
    trace = TraceRecord(question_id="q", question="the question", dataset="toy", method="maps", config_digest="d",
                        rounds=[round_], stop_reason="sufficient", final_call=call("answer"), final_answer="x",
                        golden_answers=["x"])
    credit = compute_credit(trace, gold)
    assert [q["new"] for q in credit["queries"]] == [1, 1, 0] and credit["found"] == 2
    proposer, writer1, writer2, consolidator, _ = credit["calls"]
    assert (proposer["queries"], proposer["gold"], proposer["new"]) == (2, [0, 1], 1)
    assert (writer1["gold"], writer1["new"]) == ([0, 1], 1) and writer2["new"] == 0
    assert consolidator["right"] is True
