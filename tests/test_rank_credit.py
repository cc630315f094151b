"""A search call's find graded by rank (`rl.reward.process_depth`): counted by hand on hand-built traces, graded
with a real BM25 index, paid by the process reward, and written by real branch rollouts of the tiny Qwen3 writer."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scripted_backend import DEFAULT_PASSAGES, ScriptedBackend
from test_credit import GOLD, call, maps_round, maps_trace

from maps_train.errors import ConfigError
from maps_train.questions import Question
from maps_train.recipe import RLRewardConfig, load_recipe
from maps_train.records.credit import call_credits, compute_credit, gold_known_before, rank_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import QUESTION_SEARCHED, RoundRecord, SubQueryHits
from maps_train.retrieval.base import Hit
from maps_train.retrieval.bm25 import BM25Retriever, build_bm25_index
from maps_train.rl.rank_credit import grade_branch_search
from maps_train.rl.rewards import RANK_CREDIT, process, reward_parts

RANK_2 = 1 / math.log2(3)  # a gold passage at rank 2


@pytest.fixture(scope="module")
def bm25(tmp_path_factory) -> BM25Retriever:
    """A real BM25 index over the eight passages of the scripted world (Paris ... Rhone; p4 Gustave Eiffel, p5
    Dijon)."""
    root = tmp_path_factory.mktemp("rank-credit")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": f"{p.title}\n{p.text}"}) + "\n"
                              for p in DEFAULT_PASSAGES))
    build_bm25_index(corpus, root / "index", show_progress=False)
    return BM25Retriever(root / "index")


def test_rank_credit_counted_by_hand():
    # GOLD: p4 (index 0) and p5 (index 1). p4 is known; p5 at best rank 2 over the two queries: 1/log2(3), / 2 gold.
    assert rank_credit(GOLD, {0}, [["p1", "p9"], ["p4", "p5", "p5"]]) == pytest.approx(RANK_2 / 2)
    # Both missing: p4 at rank 1 (1.0) and p5 at rank 4 (1/log2(5)); a rank-1 find of every gold scores 1.
    assert rank_credit(GOLD, set(), [["p4", "p1", "p2", "p5"]]) == pytest.approx((1 + 1 / math.log2(5)) / 2)
    assert rank_credit(GOLD, set(), [["p4"], ["p5"]]) == 1.0
    assert rank_credit(GOLD, {0, 1}, [["p4", "p5"]]) == 0.0  # nothing left to find
    assert rank_credit(GOLD, set(), [[]]) == 0.0 and rank_credit([], set(), [["p4"]]) == 0.0
    # A gold known only by title and text is matched through the passages searched.
    by_text = gold_evidence({"supporting_facts": {"title": ["Dijon"], "sent_id": [0]},
                             "context": {"title": ["Dijon"], "sentences": [["Dijon is in Burgundy."]]}})
    passages = {"c7": Hit("c7", "Dijon", "Dijon is in Burgundy. It has mustard.", 1.0)}
    assert rank_credit(by_text, set(), [["c1", "c7"]], passages) == pytest.approx(RANK_2)
    assert rank_credit(by_text, set(), [["c1", "c7"]]) == 0.0


def test_search_calls_name_their_positions_and_what_was_known_before_them():
    # Round 1 (question searched first): the question finds p4; writer 0 re-finds it, writer 1 nothing. Round 2:
    # writer 0 finds p5.
    round1 = maps_round(1, [["p4"], ["p4"], ["p9"]], sufficient=False)
    round1.calls = [c for c in round1.calls if c.role != "writer"][:1] + [call("writer"), call("writer"),
                                                                             call("consolidator")]
    round1.extra[QUESTION_SEARCHED] = True
    trace = maps_trace([round1, maps_round(2, [["p5"], ["p1"]], sufficient=True)])
    trace.credit = compute_credit(trace, GOLD)
    entries = [entry for _, entry in call_credits(trace)]
    assert [(e["role"], e.get("positions")) for e in entries] == [
        ("proposer", [1, 2]), ("writer", [1]), ("writer", [2]), ("consolidator", None),
        ("proposer", [0, 1]), ("writer", [0]), ("writer", [1]), ("consolidator", None), ("answer", None)]
    assert gold_known_before(trace.credit, 1, 0) == set()
    assert gold_known_before(trace.credit, 1, 1) == {0}  # the question's search found p4
    assert gold_known_before(trace.credit, 2, 0) == {0} and gold_known_before(trace.credit, 2, 1) == {0, 1}


def searched_trace(writer_queries: list[str], hits: list[list[str]], parsed: bool = True):
    """One MAPS round whose question search found p4 (gold 0), then one writer call per query."""
    queries = ["Where was Gustave Eiffel born?", *writer_queries]
    calls = [call("proposer"), *[call("writer", ok=parsed) for _ in writer_queries], call("consolidator")]
    round_ = RoundRecord(index=1, calls=calls, sub_queries=list(writer_queries),
                         retrieved=[SubQueryHits(q, ids) for q, ids in zip(queries, [["p4"], *hits])],
                         sufficient=True, extra={QUESTION_SEARCHED: True})
    trace = maps_trace([round_])
    trace.credit = compute_credit(trace, GOLD)
    return trace


QUESTION = Question(id="q", question="Where was Gustave Eiffel born?", golden_answers=["Dijon"],
                    metadata={"supporting_paragraphs": [{"title": p.title, "text": p.text, "corpus_id": p.id}
                                                        for p in DEFAULT_PASSAGES if p.id in ("p4", "p5")]})


def test_a_branch_writer_is_graded_by_a_real_bm25_search(bm25):
    # "engineer Dijon": BM25 puts p4 (Eiffel, engineer, Dijon) first and p5 (Dijon) second; p4 was known
    # from the question's search, so the call earns p5 at rank 2 of the question's two gold passages.
    ranked = [hit.id for hit in bm25.search(["engineer Dijon"], 8)[0]]
    assert ranked[:2] == ["p4", "p5"]
    trace = searched_trace(["engineer Dijon", "wine region"], [["p4"], ["p6"]])
    assert trace.credit["calls"][1]["new"] == 0  # the top-k credit pays it nothing
    assert grade_branch_search(trace, QUESTION, ["writer"], 0, bm25, depth=10) == pytest.approx(RANK_2 / 2, abs=1e-6)
    assert trace.credit["calls"][1][RANK_CREDIT] == pytest.approx(RANK_2 / 2, abs=1e-6)
    assert RANK_CREDIT not in trace.credit["calls"][2]  # only the branch call is graded
    # One deep: p5 is out of reach.
    assert grade_branch_search(searched_trace(["engineer Dijon"], [["p4"]]), QUESTION, ["writer"], 0, bm25,
                               depth=1) == 0.0
    # The proposer is graded over its round's written queries: p5 at rank 1 of "Dijon Burgundy capital".
    trace = searched_trace(["wine region", "Dijon Burgundy capital"], [["p6"], ["p5"]])
    assert grade_branch_search(trace, QUESTION, ["proposer"], 0, bm25, depth=10) == pytest.approx(0.5)


def test_calls_that_search_nothing_are_not_graded(bm25):
    trace = searched_trace(["engineer Dijon"], [["p4"]])
    assert grade_branch_search(trace, QUESTION, ["consolidator"], 0, bm25, depth=10) is None
    no_gold = Question(id="q", question=QUESTION.question, golden_answers=["Dijon"])
    assert grade_branch_search(trace, no_gold, ["writer"], 0, bm25, depth=10) is None
    # A writer whose output did not parse wrote no sub-query: graded 0, not left to the top-k credit.
    unparsed = searched_trace([], [])
    unparsed.rounds[0].calls.insert(1, call("writer", ok=False))
    unparsed.credit = compute_credit(unparsed, GOLD)
    assert grade_branch_search(unparsed, QUESTION, ["writer"], 0, bm25, depth=10) == 0.0


def test_the_process_reward_pays_the_graded_find_only_when_asked(bm25):
    trace = searched_trace(["engineer Dijon"], [["p4"]])
    grade_branch_search(trace, QUESTION, ["writer"], 0, bm25, depth=10)
    assert process(trace, ["writer"], 0) == 0.0  # found nothing new in its top k
    assert process(trace, ["writer"], 0, ranked=True) == pytest.approx(RANK_2 / 2, abs=1e-6)
    config = RLRewardConfig(process_depth=10)
    assert reward_parts(trace, QUESTION, ["writer"], config, branch_call=0)["process"] == pytest.approx(
        RANK_2 / 2, abs=1e-6)
    assert reward_parts(trace, QUESTION, ["writer"], RLRewardConfig(), branch_call=0)["process"] == 0.0
    with pytest.raises(ConfigError, match="rl.reward.process_depth"):
        RLRewardConfig(process_depth=0)
    from maps_train.rl.checks import check_rl_config

    with pytest.raises(ConfigError, match=r"rl.reward.process_depth \(writer\): 3 is shallower .*agent.top_k: 5"):
        check_rl_config(load_recipe(None, ["agent.top_k=5", "rl.roles=[writer]", "rl.init=base",
                                           "rl.role_reward={writer: {process_depth: 3}}"]))
    recipe = load_recipe(None, ["rl.role_reward={writer: {process_depth: 50}}"])
    assert recipe.rl.reward_for("writer").process_depth == 50 and recipe.rl.reward_for("consolidator").process_depth is None


def test_branch_rollouts_of_the_tiny_writer_carry_their_graded_find(tiny_qwen3, make_lora_adapters, bm25):
    """Real branch rollouts, the tiny Qwen3 with a LoRA writing every writer call: each branch's sampled writer
    call is searched again as deep as asked, and its credit holds exactly `rank_credit` of those searches."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maps_train.rl.policy import ModelSampler, PolicyBackend, Sampling
    from maps_train.rl.rewards import branch_of
    from maps_train.rl.rollout import BranchRollouts, policy_router, trained_trace_roles

    adapter = make_lora_adapters(tiny_qwen3, ["writer"])["writer"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32), adapter,
                                      is_trainable=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    recipe = load_recipe(None, ["agent.max_rounds=1", "agent.num_directions=2", "agent.top_k=2",
                                "agent.search_question=true", "roles.default.max_tokens=64", "rl.init=base",
                                "rl.role_reward={writer: {process_depth: 6}}"])
    roles = trained_trace_roles(recipe, "writer")
    policy = PolicyBackend(ModelSampler(lambda: model, tokenizer), tokenizer, Sampling(temperature=1.0, max_tokens=24),
                           max_model_len=2048, decoding="deployed")
    router = policy_router(recipe, roles, policy, backends={"vllm": ScriptedBackend()})
    depth = recipe.rl.reward_for("writer").process_depth
    rollouts = BranchRollouts(recipe, router, policy, bm25, roles, 2, seed=0, rank_depth=depth)
    gold = gold_evidence(QUESTION.metadata)
    searched = []
    for rollout in rollouts.run([QUESTION], step=0):
        call_, entry = branch_of(rollout.trace, roles, rollout.branch_call)
        assert call_.role == "writer" and RANK_CREDIT in entry
        queries = [rollout.trace.rounds[0].retrieved[p].query for p in entry["positions"]]
        ranked = [[hit.id for hit in hits] for hits in bm25.search(queries, depth)]
        known = gold_known_before(rollout.trace.credit, 1, entry["positions"][0]) if queries else set()
        assert entry[RANK_CREDIT] == pytest.approx(rank_credit(gold, known, ranked), abs=1e-6)
        searched.append(queries)
    assert len(searched) == 2 and all(searched), searched  # each branch call wrote a query that was searched deep
