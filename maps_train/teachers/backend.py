"""The annotation teacher as a backend of the router (`roles.<role>.backend: annotation`): it plays a role from the
question's annotations inside the real MAPS loop, so every prompt it answers is one the student will see.

It gets what any backend gets, the chat messages of each call and the question id, and answers in the role's JSON
schema (`agents.outputs`), so parsing, credit and `sft-data` work unchanged. A call the annotation cannot play (no
annotation for the question, a prompt it cannot read, a data set that names no entity to search for, an answer the
knowledge does not hold) falls back:
- to a model, where the route's `model` names one: served as `backend: vllm` would serve it;
- to the question itself where the route's model is `question` (no model): the question as direction and query,
  the passages' first sentences as observation, "unknown" as answer.
Each call's usage says who played it (`CallUsage.model`, kept in the trace): `annotation`, `annotation>question`,
or `annotation>MODEL`.

Only `maps-train traces` builds it: the router builds it only when given the annotations (`Annotations`, read from
`traces.questions`), and every other command refuses a recipe with it in one line (`llm.router`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from maps_train.agents.outputs import deployed_json
from maps_train.agents.prompt_context import first_sentences
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import RoleRoute
from maps_train.retrieval.base import Hit
from maps_train.teachers import policy
from maps_train.teachers.annotations import Annotation, read_annotations
from maps_train.teachers.reading import PromptReader, PromptView

PLAYED = "annotation"
NO_MODEL = "question"  # an annotation route's model that names no fallback model: the question is the fallback


class Annotations(dict):
    """Question id -> `Annotation`: what the router needs to build annotation backends."""

    @classmethod
    def from_files(cls, paths: Iterable[str]) -> Annotations:
        return cls(read_annotations(paths))

    def backend(self, fallback: Callable[[RoleRoute], Any] | None = None,
                prompts_dir: str | None = None) -> AnnotationBackend:
        return AnnotationBackend(self, fallback=fallback, prompts_dir=prompts_dir)


def teacher_of(model: str) -> str | None:
    """Who played a call, from its usage's model: "annotation", "question", a model name; None: no annotation route."""
    if model == PLAYED:
        return PLAYED
    head, sep, rest = model.partition(">")
    return rest if head == PLAYED and sep else None


class AnnotationBackend:
    concurrent = True  # no state between calls: the continuous schedule may call it from many threads

    def __init__(self, annotations: Mapping[str, Annotation], fallback: Callable[[RoleRoute], Any] | None = None,
                 prompts_dir: str | None = None):
        self.annotations = annotations
        self.fallback = fallback
        self.reader = PromptReader(prompts_dir)

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        routes = routes or [RoleRoute(backend="annotation", model=NO_MODEL)] * len(requests)  # type: ignore[arg-type]
        results: list[Completion | None] = [None] * len(requests)
        to_model: list[int] = []
        for i, (request, route) in enumerate(zip(requests, routes)):
            start = time.perf_counter()
            view = self.reader.read(request.role, request.messages)
            annotation = self.annotations.get(request.question_id or "")
            output = play(request.role, annotation, view) if annotation and view else None
            if output is not None:
                results[i] = completion(output, PLAYED, start)
            elif route.model != NO_MODEL and self.fallback is not None:
                to_model.append(i)
            else:
                results[i] = completion(question_fallback(request, view, annotation), f"{PLAYED}>{NO_MODEL}", start)
        if to_model:
            groups: dict[str, list[int]] = {}
            for i in to_model:
                groups.setdefault(routes[i].model, []).append(i)
            for rows in groups.values():
                backend = self.fallback(routes[rows[0]])  # type: ignore[misc]
                for i, comp in zip(rows, backend.generate([requests[i] for i in rows], [routes[i] for i in rows])):
                    comp.model = f"{PLAYED}>{comp.model or routes[i].model}"
                    results[i] = comp
        return results  # type: ignore[return-value]


def play(role: str, annotation: Annotation, view: PromptView) -> dict | None:
    """The role's output from the annotation, or None where it gives the role nothing to go on."""
    if role == "proposer":
        return policy.propose(annotation, view)
    if role == "writer":
        return policy.write(annotation, view)
    if role == "consolidator":
        return policy.consolidate(annotation, view)
    if role == "answer" and view.template.startswith("maps/answer_short"):
        output, supported = policy.answer(annotation, view)
        return output if supported else None
    return None


def question_fallback(request: ChatRequest, view: PromptView | None, annotation: Annotation | None) -> dict:
    """What the role says with nothing but its prompt: the question as direction and query, the passages' first
    sentences, not sufficient, "unknown" (or the first option letter)."""
    question = (view.question if view else "") or (annotation.question if annotation else "") or "the question"
    schema = (request.json_schema or {}).get("properties", {})
    if "directions" in schema:
        n = schema["directions"].get("minItems", 1)
        return {"directions": [policy.QUESTION_DIRECTION] * n}
    if "queries" in schema:
        return {"queries": [question] * schema["queries"].get("minItems", 1)}
    if "query" in schema:
        return {"query": question[:200]}
    if "observation" in schema:
        hits = [Hit(id=str(p.number), score=0.0, title="", text=p.line) for p in (view.passages if view else [])]
        return {"observation": first_sentences(hits), "state": view.state if view and view.state else
                "Nothing is established yet.", "sufficient": False}
    letters = schema.get("answer", {}).get("enum")
    if answered := (policy.answer(annotation, view)[0]["answer"] if annotation and view else None):
        if not letters:
            return {"answer": answered}
    return {"answer": letters[0] if letters else "unknown"}


def completion(output: dict, model: str, start: float) -> Completion:
    text = deployed_json(output)  # as the student's own decoding would write it: these are its SFT targets
    return Completion(text=text, generated=text, model=model, finish_reason="stop",
                      latency_s=time.perf_counter() - start, temperature=0.0)
