"""MAPS end to end on real components: the tiny Qwen3 through the hf backend (`build_router`), MiniLM and a real
FAISS index (`build_retriever`) over the paragraphs of five real HotpotQA questions.

The tiny model has random weights, so its outputs are mostly unparseable: this checks that a real run completes
on the fallbacks, counts them, records every call with its real token usage, and resumes without duplicates.
"""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from maps_train.records import TraceRecord, iter_traces

N_QUESTIONS = 5


@pytest.fixture(scope="module")
def one_torch_thread():
    """On the shared 2-core machine, 2 intra-op threads under load ran the tiny model ~4x slower than 1."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small_world(tmp_path_factory, realdata, tiny_qwen3, minilm, one_torch_thread):
    """Five HotpotQA dev questions, a corpus of their 10 paragraphs each, a recipe routing every role to the tiny
    Qwen3 on the hf backend, and the router and retriever that recipe builds (shared by the runs below)."""
    from worlds import write_paragraph_world

    from maps_train.llm.router import build_router
    from maps_train.recipe import load_recipe
    from maps_train.retrieval.factory import build_retriever

    root = tmp_path_factory.mktemp("maps_e2e")
    corpus, _, passages = write_paragraph_world(realdata / "hotpotqa" / "dev.jsonl", N_QUESTIONS, root)
    recipe_data = {
        "name": "maps-e2e",
        "retrieval": {"corpus": str(corpus), "encoder": minilm, "fp16": False},
        "backend": {"dtype": "float32", "max_model_len": 4096, "hf_batch_size": 64},
        "roles": {"default": {"backend": "hf", "model": tiny_qwen3, "max_tokens": 24}},
        "agent": {"num_directions": 2, "max_rounds": 2, "top_k": 3, "batch_size": 4, "max_passage_words": 60},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe_data))
    recipe = load_recipe(str(root / "recipe.yaml"))
    router = build_router(recipe)
    yield root, recipe, router, build_retriever(recipe.retrieval), set(passages)
    router.close()


def run_cli(root, out, limit):
    from maps_train.cli import app

    args = ["run", str(root / "recipe.yaml"), "--questions", str(root / "questions.jsonl"), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--limit", str(limit), "--no-progress"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.mark.slow
def test_maps_runs_end_to_end_with_real_models_and_resumes(small_world, tmp_path, tiny_qwen3):
    from maps_train.agents import run_method
    from maps_train.questions import load_questions

    root, recipe, router, retriever, corpus_ids = small_world
    questions = load_questions(root / "questions.jsonl")
    out = tmp_path / "run"
    records = run_method(recipe, questions[:3], out, backend=router, retriever=retriever, progress=False)
    assert [r.question_id for r in records] == [q.id for q in questions[:3]]

    traces = [t for _, t in iter_traces(out / "traces.jsonl")]
    assert all(isinstance(t, TraceRecord) for t in traces) and len(traces) == 3
    for trace in traces:
        assert 1 <= trace.num_rounds <= 2 and trace.stop_reason in ("sufficient", "max_rounds")
        for round_ in trace.rounds:
            # Real retrieval: every sub-query got real corpus passages; evidence is their deduplicated union.
            assert len(round_.retrieved) == len(round_.sub_queries) >= 1
            ids = [pid for r in round_.retrieved for pid in r.passage_ids]
            assert ids and set(ids) <= corpus_ids and all(len(r.passage_ids) == 3 for r in round_.retrieved)
            assert sorted(round_.evidence_ids) == sorted(set(ids))
            roles = [c.role for c in round_.calls]
            assert roles == ["proposer"] + ["writer"] * len(round_.directions) + ["consolidator"]
        for call in trace.all_calls():
            assert call.usage.model == tiny_qwen3 and call.usage.prompt_tokens > 100
            assert 0 < call.usage.completion_tokens <= 24
            assert call.messages[-1]["role"] == "user" and "Question:" in call.messages[-1]["content"]
        failed = [c for c in trace.all_calls() if not c.parse_ok]
        assert sum(trace.parse_failures.values()) == len(failed)
        assert all(c.parse_error for c in failed)
        assert trace.cost.calls == len(trace.all_calls())
        assert trace.cost.prompt_tokens == sum(c.usage.prompt_tokens for c in trace.all_calls())

    answers_path = out / "answers.jsonl"
    answers = [json.loads(line) for line in answers_path.read_text().splitlines()]
    assert answers == [r.to_dict() for r in records]
    assert all(a["cost"]["retrievals"] >= 1 and a["cost"]["latency_s"] > 0 for a in answers)

    # A kill mid-write leaves a torn last line; the rerun on 5 questions completes the rest, once each.
    text = answers_path.read_text()
    answers_path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    records = run_method(recipe, questions, out, backend=router, retriever=retriever, progress=False)
    assert [r.question_id for r in records] == [q.id for q in questions]
    answers = [json.loads(line) for line in answers_path.read_text().splitlines()]
    assert len(answers) == N_QUESTIONS and len({a["question_id"] for a in answers}) == N_QUESTIONS
    trace_ids = [t.question_id for _, t in iter_traces(out / "traces.jsonl")]
    assert sorted(trace_ids) == sorted(a["question_id"] for a in answers)

    # The command line over the finished folder: nothing left to run (no model is loaded), the same records.
    assert f"{N_QUESTIONS} questions -> {out}" in run_cli(root, out, limit=N_QUESTIONS)
    assert len(answers_path.read_text().splitlines()) == N_QUESTIONS
