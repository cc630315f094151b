"""run_method's files: answers and traces, resume after a kill without duplicates, chunking, trace reading."""

from __future__ import annotations

import json

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents import available_methods, engine_class, run_method
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records import TRACE_SCHEMA_VERSION, TraceFormatError, TraceRecord, iter_traces


def recipe(*overrides):
    return load_recipe(None, ["agent.max_rounds=3", "agent.num_directions=2", "agent.batch_size=4", *overrides])


def questions(n):
    return [
        Question(id=f"q{i}", question=f"question number {i}?", golden_answers=[f"a{i}"], dataset="toy")
        for i in range(n)
    ]


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(out, n, *overrides, backend=None, schedule="step"):
    backend = backend or ScriptedBackend({"consolidator": consolidator_sufficient_after(2)})
    records = run_method(
        recipe(f"agent.schedule={schedule}", *overrides), questions(n), out, backend=backend,
        retriever=RecordingRetriever(), progress=False,
    )
    return records, backend


def by_id(rows):
    return sorted(rows, key=lambda row: row["question_id"])


def test_writes_answers_and_traces(tmp_path, schedule):
    records, _ = run(tmp_path, 3, schedule=schedule)
    answers = by_id(read_lines(tmp_path / "answers.jsonl"))  # continuous: in the order questions finished
    assert answers == [r.to_dict() for r in records]
    first = answers[0]
    assert first["question_id"] == "q0" and first["answer"] == "answer of q0" and first["method"] == "maps"
    assert first["rounds"] == 2 and first["stop_reason"] == "sufficient" and first["parse_failures"] == {}
    cost = first["cost"]
    assert cost["calls"] == 2 * (1 + 2 + 1) + 1 and cost["retrievals"] == 4 and cost["passages"] == 20
    assert set(cost["by_role"]) == {"proposer", "writer", "consolidator", "answer"}
    assert cost["prompt_tokens"] == sum(r["prompt_tokens"] for r in cost["by_role"].values()) > 0
    assert cost["latency_s"] > 0
    traces = sorted((t for _, t in iter_traces(tmp_path / "traces.jsonl")), key=lambda t: t.question_id)
    assert [t.question_id for t in traces] == ["q0", "q1", "q2"]
    assert traces[0].golden_answers == ["a0"] and traces[0].config_digest == first["config_digest"]
    assert traces[0].cost.to_dict() == cost


def test_resume_after_a_torn_last_line_gives_every_question_exactly_once(tmp_path, schedule):
    run(tmp_path, 3, schedule=schedule)
    answers_path = tmp_path / "answers.jsonl"
    text = answers_path.read_text()
    torn = read_lines(answers_path)[-1]["question_id"]  # continuous: whichever question finished last
    answers_path.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.rstrip("\n").rsplit("\n", 1)[1][:25])
    records, backend = run(tmp_path, 5, schedule=schedule)
    # Only the two new ones were run: the torn answer line was rebuilt from its question's complete trace.
    assert sorted({r.question_id for r in backend.requests("answer")}) == ["q3", "q4"] and torn in ("q0", "q1", "q2")
    assert [r.question_id for r in records] == ["q0", "q1", "q2", "q3", "q4"]
    answers = read_lines(answers_path)
    assert sorted(a["question_id"] for a in answers) == ["q0", "q1", "q2", "q3", "q4"]
    trace_ids = [t.question_id for _, t in iter_traces(tmp_path / "traces.jsonl")]
    assert sorted(trace_ids) == ["q0", "q1", "q2", "q3", "q4"]


def test_a_trace_without_its_answer_line_gets_its_answer_back_not_a_rerun(tmp_path, schedule):
    run(tmp_path, 2, schedule=schedule)
    answers_path = tmp_path / "answers.jsonl"
    whole = answers_path.read_text()
    first, second = (row["question_id"] for row in read_lines(answers_path))
    answers_path.write_text(whole.splitlines(keepends=True)[0])  # killed after `second`'s trace
    records, backend = run(tmp_path, 2, schedule=schedule)
    assert backend.batches == []  # the answer line is rebuilt from the complete trace: nothing runs again
    assert [t.question_id for _, t in iter_traces(tmp_path / "traces.jsonl")] == [first, second]
    assert answers_path.read_text() == whole and len(records) == 2


def test_a_complete_last_line_without_newline_is_kept(tmp_path, schedule):
    run(tmp_path, 2, schedule=schedule)
    answers_path = tmp_path / "answers.jsonl"
    answers_path.write_text(answers_path.read_text().rstrip("\n"))
    _, backend = run(tmp_path, 3, schedule=schedule)
    assert [r.question_id for r in backend.requests("answer")] == ["q2"]
    assert len(read_lines(answers_path)) == 3


def test_everything_done_runs_nothing(tmp_path, schedule):
    run(tmp_path, 2, schedule=schedule)
    records, backend = run(tmp_path, 2, schedule=schedule)
    assert backend.batches == [] and len(records) == 2


def test_a_damaged_middle_line_is_reported_with_file_and_line(tmp_path):
    run(tmp_path, 3)
    answers_path = tmp_path / "answers.jsonl"
    lines = answers_path.read_text().splitlines(keepends=True)
    answers_path.write_text(lines[0] + "{broken\n" + "".join(lines[1:]))
    with pytest.raises(MapsTrainError, match=r"answers.jsonl:2: invalid JSON"):
        run(tmp_path, 3)


def test_another_configuration_in_the_same_folder_is_refused(tmp_path):
    run(tmp_path, 2)
    with pytest.raises(MapsTrainError, match="another configuration"):
        run(tmp_path, 3, "agent.num_directions=3")
    run(tmp_path, 3, "agent.batch_size=1")  # batch size does not change results: resuming is fine


def test_questions_are_processed_in_chunks_of_batch_size(tmp_path):
    _, backend = run(tmp_path, 5, "agent.batch_size=2", "agent.max_rounds=1")
    assert [len(b) for b in backend.batches if b[0].role == "proposer"] == [2, 2, 1]
    assert [len(b) for b in backend.batches if b[0].role == "answer"] == [2, 2, 1]


def test_duplicate_question_ids_are_refused(tmp_path):
    with pytest.raises(MapsTrainError, match="appears twice"):
        run_method(recipe(), questions(2) * 2, tmp_path, backend=ScriptedBackend(), retriever=RecordingRetriever())


def test_unknown_method_names_the_field():
    assert "maps" in available_methods()
    with pytest.raises(MapsTrainError, match="agent.method: no engine for 'nope'"):
        engine_class("nope")


def test_iter_traces_reports_bad_lines_with_file_line_and_field(tmp_path):
    run(tmp_path, 2)
    path = tmp_path / "traces.jsonl"
    good = json.loads(path.read_text().splitlines()[0])
    old = {**good, "schema_version": 0}
    no_rounds = {k: v for k, v in good.items() if k != "rounds"}
    bad_call = json.loads(json.dumps(good))
    del bad_call["rounds"][1]["calls"][2]["raw_text"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(x) for x in [good, old, no_rounds, bad_call]) + "\n{torn")
    results = list(iter_traces(bad))
    assert [n for n, _ in results] == [1, 2, 3, 4, 5]
    assert isinstance(results[0][1], TraceRecord)
    messages = [str(r) for _, r in results[1:]]
    assert all(isinstance(r, TraceFormatError) for _, r in results[1:])
    assert (
        messages[0]
        == f"{bad}:2: schema_version: 0 is not supported (this maps-train reads version {TRACE_SCHEMA_VERSION})"
    )
    assert messages[1] == f"{bad}:3: rounds: required field is missing"
    assert messages[2] == f"{bad}:4: rounds[1].calls[2].raw_text: required field is missing"
    assert messages[3].startswith(f"{bad}:5: invalid JSON")


def test_without_a_backend_or_retriever_the_recipe_builds_them_and_the_router_is_closed(
    monkeypatch, tmp_path, tiny_qwen3
):
    """The real builders: the recipe's router starts an HF engine on the tiny Qwen3, the retriever a BM25 index over
    a three-passage corpus (built on first use). A spy on `make_backend` keeps the engine the router built (and
    still calls the real one), so the test sees that the run closed it."""
    import maps_train.llm.router as router_module

    corpus = tmp_path / "corpus.jsonl"
    passages = {"c1": "Paris is the capital of France.", "c2": "Dijon is in Burgundy.", "c3": "Lyon is on the Rhone."}
    corpus.write_text("".join(json.dumps({"id": pid, "contents": text}) + "\n" for pid, text in passages.items()))
    built = []
    real_make_backend = router_module.make_backend

    def spy(*args, **kwargs):
        built.append(real_make_backend(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(router_module, "make_backend", spy)
    config = recipe(
        "agent.max_rounds=1", "agent.top_k=2", "retrieval.kind=bm25", f"retrieval.corpus={corpus}",
        f"retrieval.index_dir={tmp_path / 'index'}", f"roles={{default: {{backend: hf, model: {tiny_qwen3}, "
        "max_tokens: 8}}",
    )
    # The random model's turns do not parse, so every search falls back to the question: BM25 ranks c1 first.
    question = Question(id="q0", question="Which city is the capital of France?", golden_answers=["Paris"])
    (record,) = run_method(config, [question], tmp_path / "out", progress=False)
    assert [type(b).__name__ for b in built] == ["HFBackend"] and built[0].model is None  # one engine, closed
    assert (tmp_path / "index" / "manifest.json").is_file()  # the BM25 index the recipe names, built on first use
    (trace,) = read_lines(tmp_path / "out" / "traces.jsonl")
    retrieved = [hits["passage_ids"] for round_ in trace["rounds"] for hits in round_["retrieved"]]
    assert retrieved and all(ids[0] == "c1" and set(ids) <= set(passages) for ids in retrieved)  # the recipe's corpus
    assert record.question_id == "q0" and record.cost.calls >= 4 and record.cost.prompt_tokens > 0  # the real model


def test_continuous_writes_each_question_the_moment_it_finishes(tmp_path):
    """q0 is sufficient after round 1, q1 after round 3: q0's answer and trace are on disk before q1's last
    consolidator call is even sent (a kill then would lose only q1)."""
    seen_on_disk = {}

    class Watching(ScriptedBackend):
        def generate(self, requests):
            for request in requests:
                if request.role == "consolidator" and request.question_id == "q1":
                    answers = tmp_path / "answers.jsonl"
                    ids = [row["question_id"] for row in read_lines(answers)] if answers.exists() else []
                    seen_on_disk[len(self.requests("consolidator", "q1"))] = ids
            return super().generate(requests)

    backend = Watching({"consolidator": consolidator_sufficient_after({"q0": 1, "q1": 3})})
    run(tmp_path, 2, "agent.max_rounds=3", backend=backend, schedule="continuous")
    assert seen_on_disk[2] == ["q0"]  # q1's third round: q0 already written
    assert [t.question_id for _, t in iter_traces(tmp_path / "traces.jsonl")] == ["q0", "q1"]


def test_auto_schedule_is_continuous_only_where_every_engine_takes_concurrent_calls():
    from maps_train.agents.schedule import resolve_schedule
    from maps_train.llm.router import Router
    from maps_train.recipe import RoleRoute

    assert resolve_schedule("auto", ScriptedBackend()) == "step"
    assert resolve_schedule("continuous", ScriptedBackend()) == "continuous"
    vllm = {"default": RoleRoute(backend="vllm", model="m"), "answer": RoleRoute(backend="openai", model="m")}
    assert resolve_schedule("auto", Router(vllm)) == "continuous"
    assert resolve_schedule("auto", Router({**vllm, "writer": RoleRoute(backend="hf", model="m")})) == "step"
    assert resolve_schedule("auto", Router({"default": RoleRoute(backend="vllm", model="m")},
                                           backends={"vllm": ScriptedBackend()})) == "step"
