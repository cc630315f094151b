"""The baselines end to end on real components: the tiny Qwen3 through the hf backend (build_router), MiniLM and a
real FAISS index (build_retriever) over the paragraphs of three real HotpotQA questions, through `run_method`.

The tiny model has random weights: it never writes a search marker, so the runs check that each method completes
on real calls (real chat templates, real continuation of a partial assistant turn, real token counts) and writes
its records. The search paths of Search-o1 and ParallelSearch then run on the real index with the reasoner
scripted (the named `ScriptedBackend`; a random model cannot be made to search) and, for Search-o1, the real model
as the condenser.
"""

from __future__ import annotations

import pytest
from scripted_backend import ScriptedBackend

from maps_train.agents.runner import run_method
from maps_train.llm.call_spec import call_spec
from maps_train.llm.rendering import render_prompt
from maps_train.llm.router import Router, build_router
from maps_train.llm.types import ChatRequest
from maps_train.questions import load_questions
from maps_train.recipe import RoleRoute, load_recipe
from maps_train.records import iter_traces

N_QUESTIONS = 3
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory, realdata, tiny_qwen3, minilm):
    """Three HotpotQA dev questions, a corpus of their paragraphs, a router and a retriever shared by every run."""
    from worlds import write_paragraph_world

    from maps_train.retrieval.factory import build_retriever

    root = tmp_path_factory.mktemp("baselines_e2e")
    _, _, passages = write_paragraph_world(realdata / "hotpotqa" / "dev.jsonl", N_QUESTIONS, root)
    overrides = [
        f"retrieval.corpus={root / 'corpus.jsonl'}",
        f"retrieval.encoder={minilm}",
        "retrieval.fp16=false",
        "backend.dtype=float32",
        "backend.max_model_len=4096",
        "backend.hf_batch_size=64",
        "roles.default.backend=hf",
        f"roles.default.model={tiny_qwen3}",
        f"roles.default.max_tokens={MAX_TOKENS}",
        "agent.top_k=3",
        "agent.max_searches=2",
        "agent.max_turns=3",
        "agent.batch_size=2",
    ]
    base = load_recipe(None, overrides)
    router = build_router(base)
    retriever = build_retriever(base.retrieval)
    yield {
        "root": root,
        "overrides": overrides,
        "router": router,
        "retriever": retriever,
        "corpus_ids": set(passages),
        "questions": load_questions(root / "questions.jsonl"),
    }
    router.close()


def run(world, method, out, backend=None):
    recipe = load_recipe(None, [*world["overrides"], f"agent.method={method}"])
    records = run_method(
        recipe,
        world["questions"],
        out,
        backend=backend or world["router"],
        retriever=world["retriever"],
        progress=False,
    )
    return records, [t for _, t in iter_traces(out / "traces.jsonl")]


EXPECTED_ROLES = {
    "vanilla": {"generator"},
    "search_o1": {"reasoner"},  # the random model never searches, so no condenser call
    "parallel_search": {"reasoner"},
    "s3": {"searcher", "generator"},
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(EXPECTED_ROLES))
def test_baseline_runs_end_to_end_on_real_models(world, tmp_path, method, tiny_qwen3):
    records, traces = run(world, method, tmp_path / method)
    assert len(records) == N_QUESTIONS and [t.question_id for t in traces] == [q.id for q in world["questions"]]
    for trace in traces:
        assert trace.method == method and trace.stop_reason
        calls = trace.all_calls()
        assert {c.role for c in calls} == EXPECTED_ROLES[method]
        for call in calls:
            assert call.usage.model == tiny_qwen3 and call.usage.prompt_tokens > 50
            assert 0 < call.usage.completion_tokens <= MAX_TOKENS
        assert trace.cost.calls == len(calls)
        assert trace.cost.prompt_tokens == sum(c.usage.prompt_tokens for c in calls)
        retrieved = [pid for r in trace.rounds for s in r.retrieved for pid in s.passage_ids]
        assert set(retrieved) <= world["corpus_ids"]
        if method in ("vanilla", "s3"):  # these retrieve for the question before any model call
            assert len(trace.rounds[0].retrieved[0].passage_ids) == 3
        if method == "s3":
            assert trace.rounds[-1].extra["generator_passage_ids"]
        if method in ("parallel_search", "s3") and trace.num_rounds > 1 + (method == "s3"):
            # A later step continued the same assistant turn: the prompt ends with the model's earlier text.
            later = [c for c in calls if c.role != "generator"][-1]
            assert later.messages[-1]["role"] == "assistant" and later.messages[-1]["content"]


@pytest.mark.slow
def test_a_partial_assistant_turn_is_continued_by_the_real_template(world):
    backend = world["router"].backend(world["router"].route("reasoner"))
    partial = "Let me think.\n<|begin_search_query|>Eiffel<|end_search_query|>\n\n<|begin_search_result|>x<|end_search_result|>"
    request = ChatRequest(
        role="reasoner",
        messages=[{"role": "user", "content": "Q?"}, {"role": "assistant", "content": partial}],
        continue_final_message=True,
    )
    prompt = render_prompt(backend.tokenizer, call_spec(request, RoleRoute()))
    assert prompt.endswith(partial) and prompt.count("<|im_start|>assistant") == 1


class RoutedScript:
    """The scripted double behind a router key, so one role is scripted while the others run the real model."""

    def __init__(self, scripts):
        self.double = ScriptedBackend(scripts)

    def generate(self, requests, routes=None):
        return self.double.generate(requests)


def scripted_reasoner_router(world, script):
    recipe = load_recipe(None, world["overrides"])
    routes = dict(recipe.roles)
    routes["reasoner"] = RoleRoute(backend="hf", model="scripted-reasoner")
    real = world["router"].backend(recipe.route("condenser"))
    reasoner = RoutedScript({"reasoner": script})
    return Router(
        routes, backends={"hf:scripted-reasoner": reasoner, f"hf:{recipe.route('condenser').model}": real}
    ), reasoner


@pytest.mark.slow
def test_search_o1_search_path_on_the_real_index_and_real_condenser(world, tmp_path, tiny_qwen3):
    def reasoner(request, turn):
        if turn == 0:
            question = request.messages[0]["content"].rsplit("Question:\n", 1)[1].strip()
            return f"I should look this up.\n<|begin_search_query|>{question}"
        return "\\boxed{unknown}"

    router, scripted = scripted_reasoner_router(world, reasoner)
    _, traces = run(world, "search_o1", tmp_path / "o1", backend=router)
    for trace in traces:
        first = trace.rounds[0]
        assert first.extra["action"] == "search" and len(first.retrieved[0].passage_ids) == 3
        assert set(first.evidence_ids) <= world["corpus_ids"]
        condenser = [c for c in first.calls if c.role == "condenser"]
        assert len(condenser) == 1 and condenser[0].usage.model == tiny_qwen3  # the real model condensed
        assert trace.final_answer == "unknown"
    # The real condenser's output (or the original's fallback) was spliced back into the continued turn.
    second = scripted.double.requests("reasoner")[-1]
    assert second.raw_continuation and "<|begin_search_result|>" in second.raw_continuation


@pytest.mark.slow
def test_parallel_search_sub_queries_go_to_the_real_index_in_one_call(world, tmp_path):
    def reasoner(request, turn):
        if turn == 0:
            qid = request.question_id
            return f"<think>two lookups</think>\n<search> {qid} film director ## {qid} nationality"
        return "<answer> American"

    calls = []
    retriever = world["retriever"]

    class CountingRetriever:
        def search(self, queries, k):
            calls.append(list(queries))
            return retriever.search(queries, k)

    router, _ = scripted_reasoner_router(world, reasoner)
    recipe = load_recipe(None, [*world["overrides"], "agent.method=parallel_search"])
    run_method(
        recipe, world["questions"], tmp_path / "ps", backend=router, retriever=CountingRetriever(), progress=False
    )
    traces = [t for _, t in iter_traces(tmp_path / "ps" / "traces.jsonl")]
    # Two batches of questions (batch_size=2): one retrieval call each, holding every sub-query of the batch's step.
    assert [len(c) for c in calls] == [4, 2]
    for trace in traces:
        assert trace.final_answer == "American"
        assert [len(r.passage_ids) for r in trace.rounds[0].retrieved] == [3, 3]
        assert set(trace.rounds[0].evidence_ids) <= world["corpus_ids"]
