"""The MAPS method's control flow, checked on what was sent: which prompts, in how many batched calls, when it
stops, what reaches retrieval. Uses the named doubles in tests/scripted_backend.py; the real-model run is in
tests/test_maps_e2e.py."""

from __future__ import annotations

import json

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after, user_text

from maps_train.agents.maps import MapsEngine
from maps_train.agents.schedule import run_all
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.retrieval.base import Hit


def make_engine(overrides=(), scripts=None, retriever=None):
    recipe = load_recipe(None, ["agent.max_rounds=4", "agent.num_directions=3", "agent.top_k=2", *overrides])
    backend = ScriptedBackend(scripts)
    retriever = retriever or RecordingRetriever()
    return MapsEngine(recipe, backend, retriever), backend, retriever


def questions(n):
    return [
        Question(id=f"q{i}", question=f"Where was the engineer of tower {i} born?", dataset="toy") for i in range(n)
    ]


def all_sub_queries_before(trace, round_index):
    return [q for r in trace.rounds if r.index < round_index for q in r.sub_queries]


def prompts_of_round(backend, qid, round_index, n):
    """The rendered prompt texts of one question's round (proposer, its n writers, consolidator)."""
    proposer = backend.requests("proposer", qid)[round_index - 1]
    writers = backend.requests("writer", qid)[(round_index - 1) * n : round_index * n]
    consolidator = backend.requests("consolidator", qid)[round_index - 1]
    return [user_text(r) for r in [proposer, *writers, consolidator]]


def test_decoupled_prompts_never_hold_earlier_sub_queries(schedule):
    engine, backend, _ = make_engine()
    (trace,) = run_all(engine, questions(1), schedule)
    assert trace.num_rounds == 4 and trace.stop_reason == "max_rounds"
    for round_ in trace.rounds[1:]:
        earlier = all_sub_queries_before(trace, round_.index)
        assert earlier, "earlier rounds issued sub-queries"
        texts = prompts_of_round(backend, "q0", round_.index, 3)
        # The prompts that were sent and those recorded in the trace are the same text.
        assert texts == [user_text_of(call) for call in round_.calls]
        for text in texts:
            assert not [q for q in earlier if q in text]
        # ...but they do carry the question, the observations so far and the state.
        assert "fact 1 about q0" in texts[0] and f"reasoning after round {round_.index - 1} of q0" in texts[0]
    answer_prompt = user_text(backend.requests("answer", "q0")[0])
    assert not [q for q in all_sub_queries_before(trace, 99) if q in answer_prompt]
    assert "fact 4 about q0" in answer_prompt


def user_text_of(call):
    return "\n".join(m["content"] for m in call.messages)


def test_no_decoupling_ablation_shows_the_trajectory(schedule):
    engine, backend, retriever = make_engine(["agent.decoupled=false"])
    (trace,) = run_all(engine, questions(1), schedule)
    first = trace.rounds[0]
    for text in prompts_of_round(backend, "q0", 2, 3):
        assert all(q in text for q in first.sub_queries)
        assert "Retrieved passages:" in text
    passage_text = {p.id: p.text for p in retriever.passages}[first.evidence_ids[0]]
    assert passage_text in prompts_of_round(backend, "q0", 2, 3)[0]
    assert all(q in user_text(backend.requests("answer", "q0")[0]) for q in first.sub_queries)
    assert "(no earlier rounds)" in prompts_of_round(backend, "q0", 1, 3)[0]


def test_one_batched_call_per_role_per_step_across_questions():
    engine, backend, retriever = make_engine(["agent.max_rounds=2"])
    steps = []
    engine.on_step = steps.append  # what the runner's progress bar shows
    traces = run_all(engine, questions(4), "step")
    one_round = ["proposer x4", "writer x12", "search x12", "consolidator x4"]
    assert steps == one_round * 2 + ["answer x4"]
    # 2 steps x (proposer, writer, consolidator) + 1 answer call: every call holds one role only.
    assert backend.batch_roles() == [["proposer"], ["writer"], ["consolidator"]] * 2 + [["answer"]]
    sizes = [len(batch) for batch in backend.batches]
    assert sizes == [4, 12, 4, 4, 12, 4, 4]
    # Every writer call of a step serves all questions, N per question.
    for batch in backend.batches[1::3][:2]:
        assert sorted(r.question_id for r in batch) == sorted([f"q{i}" for i in range(4)] * 3)
    # ONE search per step, carrying all N sub-queries of all questions, with top_k.
    assert len(retriever.calls) == 2
    for step, (queries, k) in enumerate(retriever.calls, start=1):
        assert k == 2 and len(queries) == 12
        assert sorted(queries) == sorted(q for t in traces for q in t.rounds[step - 1].sub_queries)
    for trace in traces:
        for round_ in trace.rounds:
            assert len(round_.directions) == 3 and len(round_.sub_queries) == 3
            assert [r.query for r in round_.retrieved] == round_.sub_queries
            assert all(len(r.passage_ids) == 2 for r in round_.retrieved)
        assert trace.cost.retrievals == 6 and trace.cost.passages == 12
        assert trace.cost.by_role["writer"].calls == 6
        assert trace.cost.calls == 2 * (1 + 3 + 1) + 1
    assert engine.generate_calls == 7 and engine.search_calls == 2


def test_writer_prompt_holds_its_direction_and_the_schemas_are_sent(schedule):
    engine, backend, _ = make_engine(["agent.max_rounds=1"])
    (trace,) = run_all(engine, questions(1), schedule)
    directions = trace.rounds[0].directions
    writer_texts = [user_text(r) for r in backend.requests("writer")]
    assert [d in t for d, t in zip(directions, writer_texts)] == [True] * 3
    proposer_schema = backend.requests("proposer")[0].json_schema["properties"]["directions"]
    assert proposer_schema["minItems"] == proposer_schema["maxItems"] == 3
    assert proposer_schema["items"]["maxLength"] > 0
    consolidator = backend.requests("consolidator")[0].json_schema["properties"]
    assert consolidator["sufficient"] == {"type": "boolean"}
    assert consolidator["observation"]["maxLength"] > 0 and consolidator["state"]["maxLength"] > 0
    assert backend.requests("answer")[0].json_schema["properties"]["answer"]["maxLength"] > 0
    assert all(r.question_id == "q0" for r in backend.requests())


def test_stops_when_sufficient_or_at_the_round_limit(schedule):
    scripts = {"consolidator": consolidator_sufficient_after({"q0": 1, "q1": 3})}
    engine, backend, retriever = make_engine(["agent.max_rounds=4"], scripts=scripts)
    traces = run_all(engine, questions(3), schedule)
    assert [t.num_rounds for t in traces] == [1, 3, 4]
    assert [t.stop_reason for t in traces] == ["sufficient", "sufficient", "max_rounds"]
    assert [r.sufficient for r in traces[1].rounds] == [False, False, True]
    assert [t.final_answer for t in traces] == ["answer of q0", "answer of q1", "answer of q2"]
    assert [len(backend.requests("proposer", f"q{i}")) for i in range(3)] == [1, 3, 4]
    assert sum(len(q) for q, _ in retriever.calls) == 3 * (1 + 3 + 4)
    if schedule == "step":
        # Stopped questions leave the batch: proposer calls shrink 3, 2, 2, 1; the answers are one call of 3.
        assert [len(b) for b in backend.batches if b[0].role == "proposer"] == [3, 2, 2, 1]
        assert [len(b) for b in backend.batches if b[0].role == "answer"] == [3]
        assert [len(q) for q, _ in retriever.calls] == [9, 6, 6, 3]
    else:
        # Each question goes on alone: q0 is answered while q2 is still searching (its later rounds follow).
        order = [(r.role, r.question_id) for batch in backend.batches for r in batch]
        assert order.index(("answer", "q0")) < max(i for i, call in enumerate(order) if call == ("proposer", "q2"))


def test_a_stop_before_min_rounds_is_recorded_and_the_search_goes_on(schedule):
    # q0 says "sufficient" from round 1, q1 from round 3: with min_rounds 2, q0 searches 2 rounds (round 1's stop is
    # kept in its trace as said), q1 is unaffected, q2 (never sufficient) still ends at max_rounds.
    scripts = {"consolidator": consolidator_sufficient_after({"q0": 1, "q1": 3})}
    engine, backend, retriever = make_engine(["agent.max_rounds=4", "agent.min_rounds=2"], scripts=scripts)
    traces = run_all(engine, questions(3), schedule)
    assert [t.num_rounds for t in traces] == [2, 3, 4]
    assert [t.stop_reason for t in traces] == ["sufficient", "sufficient", "max_rounds"]
    assert [r.sufficient for r in traces[0].rounds] == [True, True]
    assert [len(backend.requests("consolidator", f"q{i}")) for i in range(3)] == [2, 3, 4]


@pytest.mark.parametrize("value", ["0", "5"])
def test_min_rounds_outside_one_to_max_rounds_is_a_one_line_error(value):
    from maps_train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"agent: min_rounds must be from 1 to max_rounds \(4\), got " + value):
        load_recipe(None, ["agent.max_rounds=4", f"agent.min_rounds={value}"])


def test_max_rounds_one_and_single_direction(schedule):
    engine, backend, retriever = make_engine(["agent.max_rounds=1", "agent.num_directions=1"])
    (trace,) = run_all(engine, questions(1), schedule)
    assert trace.num_rounds == 1 and trace.stop_reason == "max_rounds"
    assert len(trace.rounds[0].sub_queries) == 1 and len(retriever.calls[0][0]) == 1
    assert [len(b) for b in backend.batches] == [1, 1, 1, 1]


def test_no_directions_ablation_writes_n_queries_in_one_call():
    engine, backend, retriever = make_engine(["agent.use_directions=false", "agent.max_rounds=2"])
    traces = run_all(engine, questions(2), "step")  # batch shapes: the step schedule's contract
    assert not backend.requests("proposer")
    assert backend.batch_roles() == [["writer"], ["consolidator"]] * 2 + [["answer"]]
    assert [len(b) for b in backend.batches] == [2, 2, 2, 2, 2]
    assert backend.requests("writer")[0].json_schema["properties"]["queries"]["maxItems"] == 3
    assert [len(q) for q, _ in retriever.calls] == [6, 6]
    assert traces[0].rounds[0].directions == [] and len(traces[0].rounds[0].sub_queries) == 3
    assert "Write exactly 3 search queries" in user_text(backend.requests("writer")[0])


def test_evidence_is_merged_and_deduplicated_by_passage_id(schedule):
    engine, _, _ = make_engine(["agent.max_rounds=1", "agent.top_k=3"])
    (trace,) = run_all(engine, questions(1), schedule)
    round_ = trace.rounds[0]
    retrieved = [pid for r in round_.retrieved for pid in r.passage_ids]
    # All three sub-queries share words ("lookup", "of", "q0"...), so their hits overlap.
    assert len(retrieved) == 9 and len(set(retrieved)) < 9
    assert sorted(round_.evidence_ids) == sorted(set(retrieved))
    assert len(round_.evidence_ids) == len(set(round_.evidence_ids))
    consolidator_text = user_text_of(round_.calls[-1])
    assert consolidator_text.count("[1] ") == 1 and f"[{len(round_.evidence_ids) + 1}] " not in consolidator_text


def test_malformed_outputs_take_the_fallbacks_and_are_counted(schedule):
    scripts = {
        "proposer": lambda request, turn: "I think we should search for stuff",
        "writer": lambda request, turn: "",
        "consolidator": lambda request, turn: '{"observation": "half a fact',
        "answer": lambda request, turn: "  Paris, probably.  ",
    }
    engine, _, retriever = make_engine(["agent.max_rounds=2"], scripts=scripts)
    (trace,) = run_all(engine, questions(1), schedule)
    question = "Where was the engineer of tower 0 born?"
    for round_ in trace.rounds:
        assert round_.directions == [question]  # proposer fallback: the question itself
        assert round_.sub_queries == [question]  # writer fallback: the direction text
        assert round_.sufficient is False and round_.state == ""  # state unchanged, not sufficient
        assert round_.observation == "half a fact"  # recovered from the cut-off JSON
        assert [c.parse_ok for c in round_.calls] == [False, False, False]
        assert all(c.parse_error for c in round_.calls)
    assert trace.stop_reason == "max_rounds"
    assert trace.final_answer == "Paris, probably." and trace.final_call.parse_ok is False
    assert trace.parse_failures == {"proposer": 2, "writer": 2, "consolidator": 2, "answer": 1}
    assert retriever.calls[0][0] == [question]


def test_consolidator_prose_becomes_the_observation_and_empty_output_uses_the_evidence(schedule):
    outputs = iter(["The tower was designed by Gustave Eiffel.", ""])
    scripts = {"consolidator": lambda request, turn: next(outputs)}
    engine, _, _ = make_engine(["agent.max_rounds=2"], scripts=scripts)
    (trace,) = run_all(engine, questions(1), schedule)
    assert trace.rounds[0].observation == "The tower was designed by Gustave Eiffel."
    # Nothing usable: the first sentences of the top merged passages.
    assert trace.rounds[1].observation.startswith(f"{trace_first_title(trace, engine)}: ")


def trace_first_title(trace, engine):
    first_id = trace.rounds[1].evidence_ids[0]
    return {p.id: p.title for p in engine.retriever.passages}[first_id]


def test_multiple_choice_answers_with_a_letter(schedule):
    question = Question(id="g1", question="Which is a noble gas?", options=["Iron", "Neon", "Salt", "Water"])
    scripts = {"answer": lambda request, turn: "The answer is (B)."}
    engine, backend, _ = make_engine(["agent.max_rounds=1"], scripts=scripts)
    (trace,) = run_all(engine, [question], schedule)
    request = backend.requests("answer")[0]
    assert request.json_schema["properties"]["answer"]["enum"] == ["A", "B", "C", "D"]
    assert "B. Neon" in user_text(request) and "A, B, C, D" in user_text(request)
    assert "B. Neon" in user_text(backend.requests("proposer")[0])
    assert trace.final_answer == "B" and trace.parse_failures == {"answer": 1}


def test_choice_mode_without_options_is_a_clear_error(schedule):
    engine, _, _ = make_engine(["agent.answer_mode=choice"])
    with pytest.raises(MapsTrainError, match="agent.answer_mode=choice: question 'q0' has no options"):
        run_all(engine, questions(1), schedule)


def test_trace_records_every_call_verbatim_and_round_trips(schedule):
    engine, backend, _ = make_engine(["agent.max_rounds=2"])
    (trace,) = run_all(engine, questions(1), schedule)
    sent = [r.messages for r in backend.requests()]
    assert [c.messages for c in trace.all_calls()] == sent
    call = trace.rounds[0].calls[0]
    assert call.role == "proposer" and call.parse_ok and call.usage.model == "scripted"
    assert json.loads(call.raw_text) == call.parsed
    data = json.loads(json.dumps(trace.to_dict()))
    assert data["schema_version"] == 1
    from maps_train.records.trace import TraceRecord

    assert TraceRecord.from_dict(data) == trace


def test_identical_sub_queries_are_searched_once_but_kept_per_direction(schedule):
    scripts = {"writer": lambda request, turn: '{"query": "Eiffel Tower"}'}
    engine, _, retriever = make_engine(["agent.max_rounds=1"], scripts=scripts)
    trace, _ = run_all(engine, questions(2), schedule)
    assert retriever.calls[0][0] == ["Eiffel Tower"]
    assert trace.rounds[0].sub_queries == ["Eiffel Tower"] * 3 and trace.cost.retrievals == 3


def test_bad_agent_settings_are_reported():
    with pytest.raises(MapsTrainError, match="agent.num_directions"):
        make_engine(["agent.num_directions=0"])


def test_retriever_hits_are_capped_at_top_k(schedule):
    class GenerousRetriever(RecordingRetriever):
        def search(self, queries, k):
            self.calls.append((list(queries), k))
            return [[Hit(f"x{i}", "T", "text", 1.0) for i in range(k + 5)] for _ in queries]

    engine, _, _ = make_engine(["agent.max_rounds=1"], retriever=GenerousRetriever())
    (trace,) = run_all(engine, questions(1), schedule)
    assert all(len(r.passage_ids) == 2 for r in trace.rounds[0].retrieved)
