"""The baselines' protocols, checked on what was sent: which text is spliced back, what reaches retrieval and in
how many batched calls, what the generator sees. Uses the named doubles in tests/scripted_backend.py (scripts
write what a backend returns: text up to, not including, the stop string); the real-model runs are in
tests/test_baselines_e2e.py."""

from __future__ import annotations

import json

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, user_text

from maps_train.agents.baselines.answers import (
    extract_answer_tag,
    extract_direct_answer,
    extract_reasoned_answer,
    last_boxed,
)
from maps_train.agents.baselines.parallel_search import ParallelSearchEngine, parse_action
from maps_train.agents.baselines.s3 import S3Engine, parse_searcher
from maps_train.agents.baselines.search_o1 import (
    BEGIN_QUERY,
    BEGIN_RESULT,
    END_QUERY,
    END_RESULT,
    LIMIT_REFUSAL,
    REPEAT_REFUSAL,
    SearchO1Engine,
    abridge_reasoning,
    parse_condensed,
)
from maps_train.agents.baselines.vanilla import VanillaRAGEngine
from maps_train.agents.runner import run_method
from maps_train.agents.schedule import run_all
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.trace import TraceRecord


def make(engine_cls, scripts, overrides=(), retriever=None):
    recipe = load_recipe(None, ["agent.top_k=3", *overrides])
    backend = ScriptedBackend(scripts)
    retriever = retriever or RecordingRetriever()
    return engine_cls(recipe, backend, retriever), backend, retriever


def questions(n, options=None):
    return [
        Question(
            id=f"q{i}", question=f"Where was the engineer of the Eiffel Tower {i} born?", dataset="toy", options=options
        )
        for i in range(n)
    ]


def assistant_text(request):
    """The partial assistant turn a request continues: sent raw after the generation prompt (RawTurnBackend)."""
    assert request.raw_continuation and request.messages[-1]["role"] == "user"
    return request.raw_continuation


def passage_texts(retriever):
    return {p.id: p.text for p in retriever.passages}


# -- Vanilla RAG ---------------------------------------------------------------------------------------------------


def test_vanilla_one_retrieval_and_one_generate_call_for_a_batch():
    engine, backend, retriever = make(VanillaRAGEngine, {"generator": lambda r, t: f"Dijon ({r.question_id})"})
    traces = run_all(engine, questions(4), "step")
    assert len(retriever.calls) == 1 and retriever.calls[0] == ([q.question for q in questions(4)], 3)
    assert len(backend.batches) == 1 and [r.role for r in backend.batches[0]] == ["generator"] * 4
    texts = passage_texts(retriever)
    for trace, request in zip(traces, backend.batches[0]):
        assert trace.final_answer == f"Dijon ({trace.question_id})" and trace.stop_reason == "answered"
        assert len(trace.rounds[0].evidence_ids) == 3
        assert all(texts[pid] in user_text(request) for pid in trace.rounds[0].evidence_ids)
        assert trace.cost.retrievals == 1 and trace.cost.by_role["generator"].calls == 1


def test_vanilla_multiple_choice_answers_a_letter(schedule):
    engine, backend, _ = make(VanillaRAGEngine, {"generator": lambda r, t: "(B) Dijon"})
    (trace,) = run_all(engine, questions(1, options=["Paris", "Dijon", "Lyon", "Nice"]), schedule)
    assert trace.final_answer == "B"
    assert "B. Dijon" in user_text(backend.batches[0][0]) and "letter" in user_text(backend.batches[0][0])


# -- Search-o1 -----------------------------------------------------------------------------------------------------


def o1_reasoner(queries_by_turn, final="So the engineer was born in Dijon. \\boxed{Dijon}"):
    """Turn t writes a search for queries_by_turn[t] (stopping where the backend stops: before the end marker)."""

    def script(request, turn):
        if turn < len(queries_by_turn):
            return f"Step {turn}: I need more facts.\n{BEGIN_QUERY}{queries_by_turn[turn]}"
        return final

    return script


def o1_condenser(request, turn):
    return f"Reading them.\n**Final Information**\n\nCONDENSED {request.question_id} #{turn}: Eiffel was born in Dijon."


def test_search_o1_splices_the_condensed_result_and_the_history_grows(schedule):
    scripts = {"reasoner": o1_reasoner(["Gustave Eiffel birthplace", "Dijon region"]), "condenser": o1_condenser}
    engine, backend, retriever = make(SearchO1Engine, scripts)
    (trace,) = run_all(engine, questions(1), schedule)
    reasoner = backend.requests("reasoner")
    assert len(reasoner) == 3 and trace.stop_reason == "answered" and trace.final_answer == "Dijon"
    assert reasoner[0].raw_continuation is None and reasoner[0].stop == [END_QUERY]
    second, third = assistant_text(reasoner[1]), assistant_text(reasoner[2])
    # The query is closed again and the condensed text, not the passages, is spliced between the result markers.
    assert f"{BEGIN_QUERY}Gustave Eiffel birthplace{END_QUERY}" in second
    assert f"{BEGIN_RESULT}CONDENSED q0 #0: Eiffel was born in Dijon.{END_RESULT}" in second
    texts = passage_texts(retriever)
    assert not [pid for pid in trace.rounds[0].evidence_ids if texts[pid] in second]
    # The full history stays: turn 3 continues turn 2's text, and holds both condensed results.
    assert third.startswith(second) and "CONDENSED q0 #1" in third
    # The condenser saw the query, the passages and the abridged reasoning.
    condenser = user_text(backend.requests("condenser")[0])
    assert "Gustave Eiffel birthplace" in condenser and "Step 1: Step 0: I need more facts." in condenser
    assert all(texts[pid] in condenser for pid in trace.rounds[0].evidence_ids)
    assert [r.extra["action"] for r in trace.rounds] == ["search", "search", "answer"]
    assert [r.observation for r in trace.rounds[:2]] == [
        "CONDENSED q0 #0: Eiffel was born in Dijon.",
        "CONDENSED q0 #1: Eiffel was born in Dijon.",
    ]


def test_search_o1_refuses_a_repeated_query_without_searching(schedule):
    scripts = {
        "reasoner": o1_reasoner(["Gustave Eiffel birthplace", "Gustave Eiffel birthplace"]),
        "condenser": o1_condenser,
    }
    engine, backend, retriever = make(SearchO1Engine, scripts)
    (trace,) = run_all(engine, questions(1), schedule)
    assert len(retriever.calls) == 1 and len(backend.requests("condenser")) == 1
    third = assistant_text(backend.requests("reasoner")[2])
    assert third.count(f"{BEGIN_RESULT}{REPEAT_REFUSAL}{END_RESULT}") == 1
    assert trace.rounds[1].extra["action"] == "repeat_refused" and trace.rounds[1].retrieved == []
    assert trace.cost.retrievals == 1


def test_search_o1_search_limit_and_turn_limit(schedule):
    scripts = {"reasoner": o1_reasoner([f"query number {i}" for i in range(20)]), "condenser": o1_condenser}
    engine, backend, retriever = make(SearchO1Engine, scripts, ["agent.max_searches=2", "agent.max_turns=4"])
    (trace,) = run_all(engine, questions(1), schedule)
    assert trace.stop_reason == "max_turns" and trace.num_rounds == 4
    assert [r.extra["action"] for r in trace.rounds] == ["search", "search", "limit_refused", "limit_refused"]
    assert len(retriever.calls) == 2 and LIMIT_REFUSAL in assistant_text(backend.requests("reasoner")[3])
    assert trace.final_answer == ""  # no \boxed{} was ever written: scored as no answer, as the original does


def test_search_o1_batches_each_role_and_retrieval_once_per_turn():
    # q0 answers at once, q1 searches once, q2 searches twice: the calls shrink as questions finish.
    plans = {"q0": [], "q1": ["Eiffel engineer q1"], "q2": ["Eiffel engineer q2", "Dijon region"]}
    scripts = {
        "reasoner": lambda r, t: o1_reasoner(plans[r.question_id])(r, t),
        "condenser": o1_condenser,
    }
    engine, backend, retriever = make(SearchO1Engine, scripts)
    traces = run_all(engine, questions(3), "step")  # batch shapes: the step schedule's contract
    assert backend.batch_roles() == [["reasoner"], ["condenser"], ["reasoner"], ["condenser"], ["reasoner"]]
    assert [len(b) for b in backend.batches] == [3, 2, 2, 1, 1]
    assert [len(queries) for queries, _ in retriever.calls] == [2, 1]
    assert [t.num_rounds for t in traces] == [1, 2, 3] and all(t.final_answer == "Dijon" for t in traces)


def test_search_o1_protocol_pieces():
    lines = [f"line {i}" for i in range(1, 9)]
    lines[2] = f"{BEGIN_QUERY}q{END_QUERY}"
    abridged = abridge_reasoning("\n\n".join(lines)).split("\n\n")
    assert abridged == [
        "Step 1: line 1",
        "...",
        f"Step 3: {BEGIN_QUERY}q{END_QUERY}",
        "...",
        "Step 5: line 5",
        "Step 6: line 6",
        "Step 7: line 7",
        "Step 8: line 8",
    ]
    assert abridge_reasoning("a\nb") == "Step 1: a\n\nStep 2: b"
    assert (
        parse_condensed("**Final Information**\n\nEiffel\nwas born in Dijon.").value["information"]
        == "Eiffel was born in Dijon."
    )
    missing = parse_condensed("Eiffel was born in Dijon.")
    assert not missing.ok and missing.value["information"] == "No helpful information found."
    assert last_boxed(r"so \boxed{\text{Gustave {Eiffel}}} and") == "Gustave {Eiffel}"
    assert extract_reasoned_answer(r"... \boxed{(C)}", ["A", "B", "C", "D"]) == ("C", "boxed")
    assert extract_reasoned_answer("Final answer: Dijon") == ("Dijon", "answer_line")
    assert extract_reasoned_answer("I am not sure.") == ("", "none")


# -- ParallelSearch ------------------------------------------------------------------------------------------------


def parallel_reasoner(searches_by_turn):
    def script(request, turn):
        qid = request.question_id
        if turn < len(searches_by_turn):
            subs = " ## ".join(f"{s} {qid}" for s in searches_by_turn[turn])
            return f"<think>I need several facts.</think>\n<search> {subs} "
        return "<think>Now I know.</think>\n<answer> Dijon "

    return script


def test_parallel_search_sends_all_sub_queries_of_a_step_in_one_retrieval_call():
    scripts = {"reasoner": parallel_reasoner([["Gustave Eiffel birthplace", "Eiffel Tower engineer", "Dijon"]])}
    engine, backend, retriever = make(ParallelSearchEngine, scripts)
    traces = run_all(engine, questions(2), "step")  # batch shapes: the step schedule's contract
    assert len(retriever.calls) == 1
    sent, k = retriever.calls[0]
    assert k == 3 and sent == [
        f"{s} {q}" for q in ("q0", "q1") for s in ("Gustave Eiffel birthplace", "Eiffel Tower engineer", "Dijon")
    ]
    assert backend.batch_roles() == [["reasoner"], ["reasoner"]]
    texts = passage_texts(retriever)
    for trace, request in zip(traces, backend.requests("reasoner")[2:]):
        assert trace.final_answer == "Dijon" and trace.stop_reason == "answered"
        first = trace.rounds[0]
        assert len(first.sub_queries) == 3 and [r.query for r in first.retrieved] == first.sub_queries
        context = assistant_text(request)
        assert "<search> " in context and context.count("</search>") == 1
        block = context.split("<information>")[1].split("</information>")[0]
        # every sub-query's top-K is in the block, numbered per sub-query as the original concatenates them
        assert block.count("Doc 1(Title: ") == 3 and block.count("Doc 3(Title: ") == 3
        assert all(texts[h] in block for r in first.retrieved for h in r.passage_ids)


def test_parallel_search_limit_and_invalid_action(schedule):
    def script(request, turn):
        return "I am thinking without tags." if turn == 0 else f"<search> fact {turn} ## other fact {turn} "

    engine, backend, retriever = make(ParallelSearchEngine, {"reasoner": script}, ["agent.max_searches=3"])
    (trace,) = run_all(engine, questions(1), schedule)
    # 3 steps may search (one was invalid), then one last step whose search is not run.
    assert [r.extra["action"] for r in trace.rounds] == ["invalid", "search", "search", "search"]
    assert trace.stop_reason == "max_searches" and len(retriever.calls) == 2 and trace.final_answer == ""
    assert "My last action was not valid" in assistant_text(backend.requests("reasoner")[1])
    assert parse_action("<search> a ## b ##  ").value["sub_queries"] == ["a", "b"]
    assert parse_action("<answer> x </answer> <search> y").value["action"] == "answer"
    assert extract_answer_tag("<answer> Dijon </answer>") == ("Dijon", "answer_tag")


# -- S3 ------------------------------------------------------------------------------------------------------------


def s3_searcher(request, turn):
    if turn == 0:  # keeps Doc 1 of the initial results, searches once more
        return (
            "<think>Not enough yet.</think>\n<important_info>[1]</important_info>\n"
            '<search_complete>False</search_complete>\n<query>\n{"query": "Gustave Eiffel born Dijon 1832"}\n'
        )
    return "<important_info>[2, 9]</important_info>\n<search_complete>True</search_complete>"


def test_s3_generator_sees_only_the_kept_documents():
    engine, backend, retriever = make(S3Engine, {"searcher": s3_searcher, "generator": lambda r, t: "Dijon"})
    traces = run_all(engine, questions(2), "step")  # batch shapes: the step schedule's contract
    assert backend.batch_roles() == [["searcher"], ["searcher"], ["generator"]]
    assert len(retriever.calls) == 2  # the initial top-K of every question, then the step's queries, one call each
    texts = passage_texts(retriever)
    for trace, request in zip(traces, backend.requests("generator")):
        initial, searched = trace.rounds[0].evidence_ids, trace.rounds[1].evidence_ids
        kept = [initial[0], searched[1]]
        prompt = user_text(request)
        assert trace.rounds[-1].extra["generator_passage_ids"] == list(dict.fromkeys(kept))
        assert all(texts[pid] in prompt for pid in kept)
        unkept = set(initial + searched) - set(kept)
        assert unkept and not [pid for pid in unkept if texts[pid] in prompt]
        assert trace.final_answer == "Dijon" and trace.stop_reason == "search_complete"
        assert trace.rounds[1].extra["kept"] == [initial[0]] and trace.rounds[2].extra["kept"] == [searched[1]]
    # the searcher continued its own turn, with the new results spliced in as an information block
    second = assistant_text(backend.requests("searcher", "q0")[1])
    assert (
        second.rstrip().endswith("</information>") and '"query": "Gustave Eiffel born Dijon 1832"}\n</query>' in second
    )


def test_s3_a_block_never_marked_passes_whole_and_the_search_budget_holds(schedule):
    def searcher(request, turn):
        return f'<search_complete>False</search_complete>\n<query>{{"query": "fact {turn}"}}'

    engine, backend, retriever = make(
        S3Engine, {"searcher": searcher, "generator": lambda r, t: "x"}, ["agent.max_searches=2", "agent.top_k=2"]
    )
    (trace,) = run_all(engine, questions(1), schedule)
    assert trace.stop_reason == "max_searches" and len(backend.requests("searcher")) == 3
    assert len(retriever.calls) == 3  # initial + 2 searches; the last step's query is not run
    every = list(dict.fromkeys(pid for r in trace.rounds for pid in r.evidence_ids))
    assert trace.rounds[-1].extra["generator_passage_ids"] == every


def test_s3_parses_the_searcher_tags():
    value = parse_searcher('<query>{"query": ["a", "b"]}').value
    assert value == {"complete": False, "query": "a", "important": None}
    assert parse_searcher("<important_info>[3, 1, 3]</important_info><search_complete>yes</search_complete>").value == {
        "complete": True,
        "query": None,
        "important": [3, 1],
    }
    assert parse_searcher("plain words <query>who built it").value["query"] == "who built it"
    assert parse_searcher('{"query": "x"}\n', query_open=True).value["query"] == "x"
    assert not parse_searcher("nothing").ok


def test_direct_answer_extraction():
    assert extract_direct_answer("<think>hmm</think>\n Dijon ") == ("Dijon", "raw")
    assert extract_direct_answer("The answer is C.", ["A", "B", "C", "D"]) == ("C", "letter")


# -- through the shared runner ---------------------------------------------------------------------------------------


SCRIPTS = {
    "vanilla": {"generator": lambda r, t: "Dijon"},
    "search_o1": {"reasoner": o1_reasoner(["Gustave Eiffel birthplace"]), "condenser": o1_condenser},
    "parallel_search": {"reasoner": parallel_reasoner([["Eiffel", "Dijon"]])},
    "s3": {"searcher": s3_searcher, "generator": lambda r, t: "Dijon"},
}


@pytest.mark.parametrize("method", sorted(SCRIPTS))
def test_run_method_writes_answers_and_traces_and_resumes(tmp_path, method):
    recipe = load_recipe(None, [f"agent.method={method}", "agent.top_k=2", "agent.batch_size=2"])
    qs = questions(3)
    records = run_method(
        recipe,
        qs[:2],
        tmp_path,
        backend=ScriptedBackend(SCRIPTS[method]),
        retriever=RecordingRetriever(),
        progress=False,
    )
    assert [r.answer for r in records] == ["Dijon", "Dijon"] and records[0].method == method
    backend = ScriptedBackend(SCRIPTS[method])
    records = run_method(recipe, qs, tmp_path, backend=backend, retriever=RecordingRetriever(), progress=False)
    assert {r.question_id for r in backend.requests()} == {"q2"}  # only the new question ran
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    traces = [TraceRecord.from_dict(json.loads(line)) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert [a["question_id"] for a in answers] == ["q0", "q1", "q2"] == [t.question_id for t in traces]
    assert all(t.method == method and t.cost.calls >= 1 for t in traces)
    assert all(a["cost"]["retrievals"] >= 1 for a in answers)


def test_a_split_think_block_goes_back_into_the_turn():
    from maps_train.agents.baselines.base import model_piece
    from maps_train.records.trace import RoleCall

    def call(text, reasoning):
        return RoleCall(role="reasoner", messages=[], raw_text=text, parsed={}, parse_ok=True, reasoning=reasoning)

    assert model_piece(call("<search> a", None)) == "<search> a"
    assert model_piece(call("<search> a", "two facts")) == "<think>\ntwo facts\n</think>\n\n<search> a"
    assert model_piece(call("", "still thinking")) == "<think>\nstill thinking"
