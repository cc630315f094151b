"""Teachers mixed per role, one of them a model on another machine: the writer is SmolLM2 served by a real `vllm
serve` (`backend: openai`, `backend.base_urls`), every other role the annotation teacher; `maps-train traces`'
collector writes the traces, and each call's usage says who played it."""

from __future__ import annotations

import json

from test_annotation_teacher import QUESTIONS
from test_annotation_teacher_cli import write_world

from maps_train.recipe import load_recipe
from maps_train.teachers import Annotations
from maps_train.traces.collect import collect_traces


def test_a_served_model_writes_while_the_annotation_plays_the_rest(tmp_path, vllm_server, smollm2):
    """The session's `vllm serve` of SmolLM2 (its adapters unused: the writer is the base model, by its name)."""
    recipe_path, questions = write_world(tmp_path)
    recipe = load_recipe(str(recipe_path), [
        "roles.writer.backend=openai", f"roles.writer.model={smollm2}", "roles.writer.max_tokens=32",
        f"backend.base_urls=[{vllm_server}]", "traces.limit=2", "agent.max_rounds=2"])
    annotations = Annotations.from_files(recipe.traces.questions)
    totals = collect_traces(recipe, progress=False, annotations=annotations)
    assert totals["questions"] == 2
    [run] = list((tmp_path / "traces").rglob("traces.jsonl"))
    rows = [json.loads(line) for line in run.read_text(encoding="utf-8").splitlines()]
    assert sorted(row["question_id"] for row in rows) == sorted(q.id for q in QUESTIONS[:2])
    played: dict[str, set[str]] = {}
    for row in rows:
        for round_ in row["rounds"]:
            for call in round_["calls"]:
                played.setdefault(call["role"], set()).add(call["usage"]["model"])
        played.setdefault("answer", set()).add(row["final_call"]["usage"]["model"])
    assert played["writer"] == {smollm2}  # the served model, by URL
    assert played["proposer"] == played["consolidator"] == {"annotation"}
    assert played["answer"] <= {"annotation", "annotation>question"}
    writer_tokens = [call["usage"]["completion_tokens"] for row in rows for round_ in row["rounds"]
                     for call in round_["calls"] if call["role"] == "writer"]
    assert writer_tokens and all(0 < tokens <= 32 for tokens in writer_tokens)
