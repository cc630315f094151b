"""The RL reward, part by part, on scripted episodes: hand-built `TraceRecord`s (the real record classes, cost booked
through the real `Cost` the engine uses) with hand-counted expectations. Correctness in Cover-EM, EM and F1 with
and without the length guard, a choice question, a gold that normalises to ""; the format share of the trained
roles only; cost in tokens, rounds and retrievals; evidence recall by id and by title and text; and the wrappers
called the way TRL's GRPOTrainer calls a reward function, one float per completion in order."""

from __future__ import annotations

import json
import pickle

import pytest
from trl.trainer.utils import get_callable_name

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import RLRewardConfig
from maps_train.records.answer import Cost
from maps_train.records.trace import CallUsage, RoleCall, RoundRecord, SubQueryHits, TraceFormatError, TraceRecord
from maps_train.retrieval.corpus import Passage
from maps_train.rl.rewards import (
    PARTS,
    correctness,
    cost_penalty,
    evidence,
    format_share,
    reward_functions,
    reward_parts,
    reward_weights,
)


def call(role: str, parse_ok: bool, prompt_tokens: int, completion_tokens: int) -> RoleCall:
    usage = CallUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return RoleCall(role=role, messages=[{"role": "user", "content": f"{role} prompt"}], raw_text="{}", parsed={},
                    parse_ok=parse_ok, usage=usage)


def searched_round(index: int, calls: list[RoleCall], *hits: list[str]) -> RoundRecord:
    queries = [f"q{index}.{n}" for n in range(len(hits))]
    return RoundRecord(index=index, calls=calls, sub_queries=queries,
                       retrieved=[SubQueryHits(query=q, passage_ids=ids) for q, ids in zip(queries, hits)],
                       evidence_ids=list(dict.fromkeys(pid for ids in hits for pid in ids)))


def episode(answer: str, qid: str = "q1") -> TraceRecord:
    """Two MAPS rounds and the answer call, the cost booked call by call and search by search as the engine does.

    Hand counts: prompt tokens 100+50+50+200 + 110+60+210 + 150 = 930, completion 20+10+12+30 + 22+11+31 + 8 = 144
    (1074 in all); 2 rounds; 3 sub-queries searched. Parsed: proposer 1 of 2, writer 2 of 3, consolidator 1 of 2,
    answer 1 of 1. Retrieved, in order: p1 p4 p3 | p4 p5; seen (merged evidence): p1 p4 p3 | p4.
    """
    rounds = [
        searched_round(1, [call("proposer", True, 100, 20), call("writer", True, 50, 10),
                           call("writer", False, 50, 12), call("consolidator", True, 200, 30)], ["p1", "p4"], ["p3"]),
        searched_round(2, [call("proposer", False, 110, 22), call("writer", True, 60, 11),
                           call("consolidator", False, 210, 31)], ["p4", "p5"]),
    ]
    rounds[1].evidence_ids = ["p4"]  # the consolidator kept only p4: p5 was retrieved, never seen
    final_call = call("answer", True, 150, 8)
    cost = Cost()
    for role_call in [c for r in rounds for c in r.calls] + [final_call]:
        cost.add_completion(role_call.role, role_call.usage.prompt_tokens, role_call.usage.completion_tokens)
    cost.add_search(queries=2, passages=3, latency_s=0.1)
    cost.add_search(queries=1, passages=2, latency_s=0.1)
    return TraceRecord(question_id=qid, question="Where was Gustave Eiffel born?", dataset="toy", method="maps",
                       config_digest="d", rounds=rounds, stop_reason="sufficient", final_call=final_call,
                       final_answer=answer, golden_answers=["Dijon"], cost=cost)


def short_question(golds: list[str], metadata: dict | None = None, qid: str = "q1") -> Question:
    return Question(id=qid, question="Where was Gustave Eiffel born?", golden_answers=golds, dataset="toy",
                    metadata=metadata or {})


def reward(**fields) -> RLRewardConfig:
    return RLRewardConfig(**fields)


LONG_RIGHT = "He was born in the eastern French city of Dijon in Burgundy in December of 1832"  # 16 words


# --- correctness ------------------------------------------------------------------------------------------------


def test_right_short_answer_scores_one_in_every_metric():
    for metric in ("cover_em", "em", "f1"):
        assert correctness(episode("Dijon."), short_question(["Dijon"]), reward(correctness=metric)) == 1.0


def test_length_guard_zeroes_a_long_cover_em_answer_and_only_cover_em():
    question = short_question(["Dijon"])
    assert len(LONG_RIGHT.split()) == 16
    assert correctness(episode(LONG_RIGHT), question, reward(correctness="cover_em", length_guard_words=None)) == 1.0
    assert correctness(episode(LONG_RIGHT), question, reward(correctness="cover_em", length_guard_words=12)) == 0.0
    # "more than" 12: exactly 12 words still scores, 13 do not.
    twelve, thirteen = " ".join(LONG_RIGHT.split()[:12]), " ".join(LONG_RIGHT.split()[:13])
    assert correctness(episode(twelve), question, reward(correctness="cover_em", length_guard_words=12)) == 1.0
    assert correctness(episode(thirteen), question, reward(correctness="cover_em", length_guard_words=12)) == 0.0
    # EM and F1 need no guard: the long answer is scored as it is (F1: 1 shared token of 15 after "the" goes:
    # precision 1/15, recall 1, F1 = 2 * (1/15) / (16/15) = 1/8).
    assert correctness(episode(LONG_RIGHT), question, reward(correctness="em", length_guard_words=12)) == 0.0
    f1 = reward(correctness="f1", length_guard_words=12)
    assert correctness(episode(LONG_RIGHT), question, f1) == pytest.approx(1 / 8)


def test_em_and_f1_hand_computed():
    question = short_question(["Gustave Eiffel"])
    em, f1, cover = reward(correctness="em"), reward(correctness="f1"), reward(correctness="cover_em")
    # "Eiffel": EM 0; F1 overlap 1, precision 1/1, recall 1/2 -> 2/3; Cover-EM 0 (the gold is not inside).
    assert correctness(episode("Eiffel"), question, em) == 0.0
    assert correctness(episode("Eiffel"), question, f1) == pytest.approx(2 / 3)
    assert correctness(episode("Eiffel"), question, cover) == 0.0
    # "the engineer Gustave Eiffel" -> "engineer gustave eiffel": EM 0; F1 overlap 2, P 2/3, R 1 -> 0.8; Cover-EM 1.
    assert correctness(episode("the engineer Gustave Eiffel"), question, em) == 0.0
    assert correctness(episode("the engineer Gustave Eiffel"), question, f1) == pytest.approx(0.8)
    assert correctness(episode("the engineer Gustave Eiffel"), question, cover) == 1.0
    # Any alias may match: EM 1 through the second one.
    assert correctness(episode("Eiffel"), short_question(["Gustave Eiffel", "Eiffel"]), em) == 1.0


def test_a_gold_that_normalises_to_empty_never_matches():
    question = short_question(["---"])
    for metric in ("cover_em", "em", "f1"):
        assert correctness(episode("---"), question, reward(correctness=metric)) == 0.0
        assert correctness(episode("anything at all"), question, reward(correctness=metric)) == 0.0
    # Beside a real alias, only the real one can score.
    assert correctness(episode("Dijon"), short_question(["---", "Dijon"]), reward(correctness="em")) == 1.0


def test_choice_question_is_scored_by_the_letter_chosen():
    question = Question(id="q1", question="Where was Eiffel born?", golden_answers=["B"],
                        options=["Paris", "Dijon", "Lyon", "Nice"], dataset="gpqa")
    for metric in ("cover_em", "em", "f1"):
        config = reward(correctness=metric)
        assert correctness(episode("B"), question, config) == 1.0
        assert correctness(episode("The answer is C"), question, config) == 0.0
        assert correctness(episode("Dijon"), question, config) == 1.0  # the text of exactly one option
    # The guard is for sub-string matching; a letter gains nothing from length, so a long choice answer still scores.
    reasoned = "Paris is the capital and Lyon is on the Rhone but Eiffel came from Burgundy so the answer is B"
    assert len(reasoned.split()) > 12
    assert correctness(episode(reasoned), question, reward(length_guard_words=12)) == 1.0


# --- format -----------------------------------------------------------------------------------------------------


def test_format_share_counts_only_the_trained_roles_calls():
    trace = episode("Dijon")
    assert format_share(trace, ["consolidator", "answer"]) == pytest.approx(2 / 3)  # 1 of 2 + 1 of 1
    assert format_share(trace, ["proposer"]) == 0.5
    assert format_share(trace, ["writer"]) == pytest.approx(2 / 3)
    assert format_share(trace, ["proposer", "writer"]) == pytest.approx(3 / 5)
    # Every call together would be 5 of 8: the environment's failures do not count against the trained role.
    assert sum(c.parse_ok for c in trace.all_calls()) / len(trace.all_calls()) == 5 / 8
    # A trained role that never spoke earns nothing.
    assert format_share(trace, ["writer_direct"]) == 0.0


# --- cost -------------------------------------------------------------------------------------------------------


def test_cost_in_each_unit_hand_counted():
    trace = episode("Dijon")
    assert cost_penalty(trace, reward(cost_unit="tokens", cost_scale=1000.0)) == pytest.approx(-1.074)
    assert cost_penalty(trace, reward(cost_unit="tokens")) == -1074.0
    assert cost_penalty(trace, reward(cost_unit="rounds")) == -2.0
    assert cost_penalty(trace, reward(cost_unit="retrievals")) == -3.0
    assert cost_penalty(trace, reward(cost_unit="retrievals", cost_scale=2.0)) == -1.5
    # The same counters evaluation reports for the question (its answers.jsonl line).
    answer = trace.answer_record().to_dict()
    assert (answer["rounds"], answer["cost"]["retrievals"]) == (2, 3)
    assert answer["cost"]["prompt_tokens"] + answer["cost"]["completion_tokens"] == 1074
    # A turn whose sub-query was refused (Search-o1's limit) searched nothing: a round, but no retrieval.
    trace.rounds.append(RoundRecord(index=3, sub_queries=["refused"]))
    assert cost_penalty(trace, reward(cost_unit="rounds")) == -3.0
    assert cost_penalty(trace, reward(cost_unit="retrievals")) == -3.0


def test_bad_cost_scale_and_guard_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"^rl\.reward\.cost_scale: must be a finite number > 0, got 0\.0$"):
        cost_penalty(episode("Dijon"), reward(cost_scale=0.0))
    with pytest.raises(ConfigError, match=r"^rl\.reward\.cost_scale"):
        reward_functions(reward(cost_scale=-1.0), ["consolidator"])
    with pytest.raises(ConfigError, match=r"^rl\.reward\.length_guard_words: must be >= 1 or null, got 0$"):
        reward_functions(reward(length_guard_words=0), ["consolidator"])


# --- evidence ---------------------------------------------------------------------------------------------------


def test_evidence_recall_by_corpus_id():
    # Gold p4, p5 and p7; the searches found p1 p4 p3 p4 p5: 2 of 3 (every hit counts, not only the 1 of 3 seen).
    gold = {"supporting_paragraphs": [
        {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon.", "corpus_id": "p4"},
        {"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "p5"},
        {"title": "Lyon", "text": "Lyon is on the Rhone.", "corpus_id": "p7"},
    ]}
    assert evidence(episode("Dijon"), short_question(["Dijon"], gold)) == pytest.approx(2 / 3)


def test_evidence_recall_by_title_and_text_when_ids_are_absent():
    # HotpotQA's layout: gold by title, paragraphs in `context`, no corpus ids.
    gold = {
        "supporting_facts": {"title": ["Gustave Eiffel", "Dijon"], "sent_id": [1, 0]},
        "context": {"title": ["Gustave Eiffel", "Dijon"], "sentences": [
            ["Gustave Eiffel was a French civil engineer.", "He was born in Dijon."],
            ["Dijon is a city in eastern France.", "It is the capital of Burgundy."],
        ]},
    }
    passages = {
        "p1": Passage("p1", "Gustave Eiffel", "He was born in Dijon."),  # a chunk of the gold paragraph: found
        "p3": Passage("p3", "Paris", "Paris is the capital of France."),
        "p4": Passage("p4", "Dijon (city)", "Dijon is a city in eastern France."),  # another title: not found
        "p5": Passage("p5", "Burgundy", "It is the capital of Burgundy."),  # the text, under another title
    }
    question = short_question(["Dijon"], gold)
    assert evidence(episode("Dijon"), question, passages) == 0.5
    assert evidence(episode("Dijon"), question) == 0.0  # nothing to match titles and texts against


def test_no_gold_passages_scores_zero():
    assert evidence(episode("Dijon"), short_question(["Dijon"])) == 0.0


def test_reward_parts_has_exactly_the_five_parts_unweighted():
    config = reward(correctness_weight=5.0, cost_weight=0.3, cost_unit="rounds")
    parts = reward_parts(episode("Dijon"), short_question(["Dijon"]), ["consolidator", "answer"], config)
    # A trace without credit has no process reward to give.
    assert parts == {"correctness": 1.0, "format": pytest.approx(2 / 3), "cost": -2.0, "evidence": 0.0,
                     "process": 0.0}
    assert tuple(parts) == PARTS


# --- TRL's reward-function convention ---------------------------------------------------------------------------


def trl_call(function, traces: list, questions: list) -> list[float]:
    """`function` called with the keyword arguments GRPOTrainer._calculate_rewards passes (TRL 1.x): prompts,
    completions and completion ids, every input column, then trainer_state, log_extra and log_metric."""
    count = len(traces)
    return function(prompts=[[{"role": "user", "content": "p"}]] * count,
                    completions=[[{"role": "assistant", "content": "c"}]] * count,
                    completion_ids=[[1, 2]] * count, trace=traces, question=questions,
                    trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)


def as_json(record) -> dict:
    """A record as it crosses the rollout boundary: to_dict(), through JSON."""
    return json.loads(json.dumps(record.to_dict()))


def test_wrappers_return_one_float_per_completion_in_order():
    config = reward(cost_unit="retrievals", cost_scale=2.0, correctness_weight=1.0, format_weight=0.1,
                    cost_weight=0.05, evidence_weight=0.2)
    gold = {"supporting_paragraphs": [{"title": "T", "text": "x", "corpus_id": "p5"}]}
    # Three rollouts of two questions, as TRL lays a group out; the second trace retrieved nothing and answered long.
    quiet = episode(LONG_RIGHT, qid="q2")
    quiet.rounds = [RoundRecord(index=1, calls=[call("consolidator", True, 1, 1)])]
    quiet.cost.retrievals = 0
    traces = [as_json(episode("Dijon")), as_json(quiet), as_json(episode("Paris"))]
    questions = [as_json(short_question(["Dijon"], gold)), as_json(short_question(["Dijon"], qid="q2")),
                 as_json(short_question(["Dijon"], gold))]
    functions, weights = reward_functions(config, ["consolidator", "answer"]), reward_weights(config)
    assert [get_callable_name(f) for f in functions] == list(PARTS)  # what TRL logs under rewards/<name>/mean
    assert weights == [1.0, 0.1, 0.05, 0.2, 0.5]
    by_part = {f.__name__: trl_call(f, traces, questions) for f in functions}
    assert by_part == {
        "correctness": [1.0, 0.0, 0.0],  # EM: right; the gold inside 16 words; wrong
        "format": [pytest.approx(2 / 3), 1.0, pytest.approx(2 / 3)],  # q2: its one consolidator call and the answer
        "cost": [-1.5, 0.0, 0.0],  # only a right rollout pays (charge_cost: right); q2 retrieved nothing anyway
        "evidence": [1.0, 0.0, 1.0],  # p5 retrieved (though not kept); q2 has no gold passages
        "process": [0.0, 0.0, 0.0],  # traces without credit
    }
    assert all(type(value) is float for values in by_part.values() for value in values)
    # Records themselves are accepted too, and a function survives pickling (TRL's documented reward forms).
    records = [episode("Dijon"), quiet, episode("Paris")]
    revived = pickle.loads(pickle.dumps(functions[0]))
    assert trl_call(revived, records, [Question.from_dict(q) for q in questions]) == [1.0, 0.0, 0.0]


def test_wrappers_refuse_bad_rollout_fields_in_one_line():
    functions = reward_functions(reward(), ["consolidator"])
    correctness_reward = functions[0]
    traces, questions = [as_json(episode("Dijon"))], [as_json(short_question(["Dijon"]))]
    with pytest.raises(MapsTrainError, match=r"^reward correctness: TRL passed no 'trace' list"):
        correctness_reward(prompts=["p"], completions=["c"], completion_ids=[[1]], question=questions)
    with pytest.raises(MapsTrainError, match=r"^reward correctness: 1 entries in 'question' for 2 completions$"):
        correctness_reward(completions=["c", "c"], trace=traces * 2, question=questions)
    with pytest.raises(MapsTrainError, match=r"^trace\[0\]: question_id 'q1' is not the id of question\[0\] \('q9'\)$"):
        trl_call(correctness_reward, traces, [as_json(short_question(["Dijon"], qid="q9"))])
    broken = dict(traces[0], rounds=[{"index": 1}])
    with pytest.raises(TraceFormatError, match=r"^trace\[0\]: rounds\[0\]\.calls: required field is missing$"):
        trl_call(correctness_reward, [broken], questions)
    with pytest.raises(MapsTrainError, match=r"^question\[0\]: missing field 'question'$"):
        trl_call(correctness_reward, traces, [{"id": "q1"}])
