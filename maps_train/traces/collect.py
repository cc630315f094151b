"""`maps-train traces RECIPE`: teacher MAPS runs over training questions, recorded as traces.

Each questions file of `traces.questions` runs into its own folder, once per sample:
`<traces.out_dir>/<file stem>/sample-<k>/{answers,traces}.jsonl`. Every folder resumes on its own, through
`run_method`.

With `samples_per_question > 1` (rejection sampling) sample k runs with `agent.sampling` set to
`sample_temperature`, `top_p` and base seed `traces.seed` with sample index k: the agent engine puts that sampling
on every request it sends, each with its own seed derived from (seed, k, question id, role, call index of the role
in the question; `maps_train.agents.engine.request_seed`). So the k samples of a question differ, and each is
reproducible: a rerun, a resume or another batch size sends the same seeds. The routes (and so the router and its
engines, built once and shared by every sample) are not changed; the sampling travels on the requests, and each
call's trace usage records the temperature, top_p and seed it ran with. `maps-train sft-data` then keeps the
correct, fully parsed, distinct samples. A single sample runs the recipe as it is (the routes' sampling).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.questions import load_questions
from maps_train.recipe import Recipe
from maps_train.records.shards import Shard


def sample_recipe(recipe: Recipe, sample: int) -> Recipe:
    """The recipe of sample `sample`: with `traces.hint` as `agent.hint`, and for several samples the sample's
    `agent.sampling` (routes untouched: the shared router copied them when it was built, so changing them here
    would not reach it)."""
    config = recipe.traces
    if recipe.agent.hint != config.hint:
        recipe = dataclasses.replace(recipe, agent=dataclasses.replace(recipe.agent, hint=config.hint))
    if config.samples_per_question <= 1:
        return recipe
    current = recipe.agent.sampling
    sampling = dataclasses.replace(
        current,
        temperature=config.sample_temperature,
        top_p=config.top_p if config.top_p is not None else current.top_p,
        seed=config.seed,
        sample=sample,
    )
    return dataclasses.replace(recipe, agent=dataclasses.replace(recipe.agent, sampling=sampling))


def run_folder_name(path: str) -> str:
    """`<folder>-<stem>` of a questions file (`data/demo/train.jsonl` -> `demo-train`), from its absolute path, so
    `train.jsonl`, `./train.jsonl` and `/abs/demo/train.jsonl` resume in one folder; a file at `/` is its stem."""
    absolute = Path(os.path.abspath(path))  # not resolve(): a symlink loop raises there on Python 3.11
    return f"{absolute.parent.name}-{absolute.stem}" if absolute.parent.name else absolute.stem


def run_dirs(recipe: Recipe) -> list[tuple[Path, Path, int]]:
    """(questions file, output folder, sample index) for every run the recipe asks for."""
    config = recipe.traces
    if not config.questions:
        raise MapsTrainError("traces.questions: no questions files given")
    stems = [run_folder_name(path) for path in config.questions]
    if len(set(stems)) != len(stems):
        raise MapsTrainError(f"traces.questions: two files map to the same output folder ({stems})")
    return [
        (Path(path), Path(config.out_dir) / stem / f"sample-{k}", k)
        for path, stem in zip(config.questions, stems)
        for k in range(max(1, config.samples_per_question))
    ]


def collect_traces(recipe: Recipe, *, backend=None, retriever=None, progress: bool = True,
                   shard: Shard | None = None, annotations: Any = None) -> dict[str, Any]:
    """Run the teacher over every questions file and sample; returns totals for the cost log. With `shard`, only
    its questions, written under `<traces.out_dir>/shards/I-of-N/` (`maps-train merge-shards` joins them).
    `annotations`: the questions' gold annotations (`maps_train.teachers.Annotations.from_files(traces.questions)`),
    which routes with `backend: annotation` play their roles from (the annotation teacher)."""
    if shard is not None:
        traces = dataclasses.replace(recipe.traces, out_dir=str(shard.out_dir(recipe.traces.out_dir)))
        recipe = dataclasses.replace(recipe, traces=traces)
    from maps_train.agents.runner import run_method

    totals: dict[str, Any] = {"questions": 0, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "retrievals": 0, "latency_s": 0.0, "runs": []}
    router = backend
    if router is None:
        from maps_train.llm.router import build_router

        router = build_router(recipe, annotations=annotations)
    if retriever is None:
        from maps_train.retrieval.factory import build_retriever

        retriever = build_retriever(recipe.retrieval)
    try:
        for path, out_dir, sample in run_dirs(recipe):
            questions = load_questions(path, limit=recipe.traces.limit)
            if shard is not None:
                questions = shard.select(questions)
            records = run_method(sample_recipe(recipe, sample), questions, out_dir,
                                 backend=router, retriever=retriever, progress=progress)
            for record in records:
                for key in ("calls", "prompt_tokens", "completion_tokens", "retrievals", "latency_s"):
                    totals[key] += getattr(record.cost, key)
            totals["questions"] += len(records)
            totals["runs"].append({"questions_file": str(path), "out_dir": str(out_dir), "sample": sample,
                                   "questions": len(records)})
    finally:
        if backend is None and hasattr(router, "close"):
            router.close()
    return totals
