"""`maps-train traces RECIPE`: teacher MAPS runs over training questions, recorded as traces.

Each questions file of `traces.questions` runs into its own folder, once per sample:
`<traces.out_dir>/<file stem>/sample-<k>/{answers,traces}.jsonl`. With `samples_per_question > 1` every route
samples at `sample_temperature` with seed `seed + k`, so the SFT-set builder can keep the correct ones
(rejection sampling). Every folder resumes on its own, through `run_method`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.questions import load_questions
from maps_train.recipe import Recipe


def sample_recipe(recipe: Recipe, sample: int) -> Recipe:
    """The recipe for sample `sample`: unchanged for a single greedy sample, else sampled with a distinct seed."""
    config = recipe.traces
    if config.samples_per_question <= 1:
        return recipe
    roles = {
        role: dataclasses.replace(route, temperature=config.sample_temperature, seed=config.seed + sample)
        for role, route in recipe.roles.items()
    }
    return dataclasses.replace(recipe, roles=roles)


def run_dirs(recipe: Recipe) -> list[tuple[Path, Path, int]]:
    """(questions file, output folder, sample index) for every run the recipe asks for."""
    config = recipe.traces
    if not config.questions:
        raise MapsTrainError("traces.questions: no questions files given")
    stems = [Path(path).stem if Path(path).parent.name in ("", ".") else f"{Path(path).parent.name}-{Path(path).stem}"
             for path in config.questions]
    if len(set(stems)) != len(stems):
        raise MapsTrainError(f"traces.questions: two files map to the same output folder ({stems})")
    return [
        (Path(path), Path(config.out_dir) / stem / f"sample-{k}", k)
        for path, stem in zip(config.questions, stems)
        for k in range(max(1, config.samples_per_question))
    ]


def collect_traces(recipe: Recipe, *, backend=None, retriever=None, progress: bool = True) -> dict[str, Any]:
    """Run the teacher over every questions file and sample; returns totals for the cost log."""
    from maps_train.agents.runner import run_method

    totals: dict[str, Any] = {"questions": 0, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "retrievals": 0, "latency_s": 0.0, "runs": []}
    router = backend
    if router is None:
        from maps_train.llm.router import build_router

        router = build_router(recipe)
    if retriever is None:
        from maps_train.retrieval.factory import build_retriever

        retriever = build_retriever(recipe.retrieval)
    try:
        for path, out_dir, sample in run_dirs(recipe):
            questions = load_questions(path, limit=recipe.traces.limit)
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
