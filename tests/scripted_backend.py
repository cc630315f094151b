"""Named test doubles for the agent engines' control flow (beside the real-model e2e tests).

`ScriptedBackend` implements `Backend.generate`: it answers each request from a per-role script and logs every
batch it was given, so tests can assert what was sent, in how many calls. Behind a `Router` (which passes each
request's route) it also logs the `CallSpec` each request became, route and request merged: the sampling a real
backend would run (`specs`), and its completions report that sampling as a real backend's do.
`RecordingBackend` wraps a real backend and logs the same (requests and specs) on the way through. `RecordingRetriever` implements
`Retriever.search` over a handful of passages with a word-overlap score and logs every call.

The default scripts write valid JSON whose strings are unique per question, round and direction (e.g. a sub-query
"lookup D2.1 of q3"), so a test can look for any earlier sub-query in a later prompt.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

from maps_train.llm.call_spec import CallSpec, call_spec
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import RoleRoute
from maps_train.retrieval.base import Hit

# A script gets the request and the turn: how many earlier requests of this role this question made (0-based).
Script = Callable[[ChatRequest, int], str]


def user_text(request: ChatRequest) -> str:
    return "\n".join(m["content"] for m in request.messages)


def num_requested(request: ChatRequest, key: str) -> int:
    schema = request.json_schema or {}
    return int(schema.get("properties", {}).get(key, {}).get("maxItems", 1))


def default_proposer(request: ChatRequest, turn: int) -> str:
    n = num_requested(request, "directions")
    return json.dumps({"directions": [f"D{turn + 1}.{k} of {request.question_id}" for k in range(1, n + 1)]})


def default_writer(request: ChatRequest, turn: int) -> str:
    if request.json_schema and "queries" in request.json_schema.get("properties", {}):
        n = num_requested(request, "queries")
        qid = request.question_id
        return json.dumps({"queries": [f"direct lookup R{turn + 1}.{k} of {qid}" for k in range(1, n + 1)]})
    match = re.search(r"Retrieval direction:\n(.+)", user_text(request))
    direction = match.group(1).strip() if match else f"turn {turn}"
    return json.dumps({"query": f"lookup {direction}"})


def consolidator_sufficient_after(rounds: dict[str, int] | int | None) -> Script:
    """A consolidator that says "sufficient" at round rounds[question_id] (never when absent or None)."""

    def script(request: ChatRequest, turn: int) -> str:
        limit = rounds if isinstance(rounds, int) or rounds is None else rounds.get(request.question_id)
        round_number = turn + 1
        return json.dumps(
            {
                "observation": f"fact {round_number} about {request.question_id}",
                "state": f"reasoning after round {round_number} of {request.question_id}",
                "sufficient": limit is not None and round_number >= limit,
            }
        )

    return script


def default_answer(request: ChatRequest, turn: int) -> str:
    schema = request.json_schema or {}
    letters = schema.get("properties", {}).get("answer", {}).get("enum")
    return json.dumps({"answer": letters[-1] if letters else f"answer of {request.question_id}"})


class ScriptedBackend:
    """Backend test double: replies by role from scripts, logs every `generate` batch in `batches` (and, when a
    router passed routes, the merged specs in `specs`).

    `run_of(request)` tells runs of the same question apart (e.g. the sample a request's seed belongs to): a
    script's turn counts the earlier requests of the same role, question AND run. By default there is one run."""

    def __init__(self, scripts: dict[str, Script] | None = None, run_of: Callable[[ChatRequest], Hashable] | None = None):
        self.scripts: dict[str, Script] = {
            "proposer": default_proposer,
            "writer": default_writer,
            "consolidator": consolidator_sufficient_after(None),
            "answer": default_answer,
        }
        self.scripts.update(scripts or {})
        self.batches: list[list[ChatRequest]] = []
        self.specs: list[CallSpec] = []
        self.run_of = run_of or (lambda request: None)
        self._turns: Counter = Counter()

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        self.batches.append(list(requests))
        specs = [call_spec(req, route) for req, route in zip(requests, routes)] if routes else None
        self.specs.extend(specs or [])
        completions = []
        for i, request in enumerate(requests):
            key = (request.role, request.question_id, self.run_of(request))
            text = self.scripts[request.role](request, self._turns[key])
            self._turns[key] += 1
            completions.append(
                Completion(
                    text=text,
                    prompt_tokens=len(user_text(request).split()),
                    completion_tokens=len(text.split()),
                    latency_s=0.001,
                    model="scripted",
                    finish_reason="stop",
                    role=request.role,
                    **(specs[i].sampling_used() if specs else _asked(request)),
                )
            )
        return completions

    def requests(self, role: str | None = None, question_id: str | None = None) -> list[ChatRequest]:
        return [
            r
            for batch in self.batches
            for r in batch
            if (role is None or r.role == role) and (question_id is None or r.question_id == question_id)
        ]

    def batch_roles(self) -> list[list[str]]:
        """The distinct roles of each generate() call, in call order."""
        return [sorted({r.role for r in batch}) for batch in self.batches]


def _asked(request: ChatRequest) -> dict[str, Any]:
    return {"temperature": request.temperature, "top_p": request.top_p, "seed": request.seed}


class RecordingBackend:
    """Wraps a real backend: logs each batch's requests and the specs they became (as `ScriptedBackend` does),
    then lets the backend answer."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.batches: list[list[ChatRequest]] = []
        self.specs: list[CallSpec] = []

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        self.batches.append(list(requests))
        if routes:
            self.specs.extend(call_spec(req, route) for req, route in zip(requests, routes))
        return self.inner.generate(requests, routes)


DEFAULT_PASSAGES = [
    Hit("p1", "Paris", "Paris is the capital and largest city of France.", 0.0),
    Hit("p2", "France", "France is a country in Western Europe; its capital is Paris.", 0.0),
    Hit("p3", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, built in 1889.", 0.0),
    Hit("p4", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon in 1832.", 0.0),
    Hit("p5", "Dijon", "Dijon is a city in eastern France, the capital of Burgundy.", 0.0),
    Hit("p6", "Burgundy", "Burgundy is a historical region of France known for its wine.", 0.0),
    Hit("p7", "Lyon", "Lyon is the third-largest city of France, at the confluence of the Rhone and Saone.", 0.0),
    Hit("p8", "Rhone", "The Rhone is a major river of Europe that flows through Switzerland and France.", 0.0),
]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class RecordingRetriever:
    """Retriever test double: word-overlap ranking over a few passages (ties keep corpus order); logs calls."""

    def __init__(self, passages: list[Hit] | None = None):
        self.passages = passages or DEFAULT_PASSAGES
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        results = []
        for query in queries:
            words = _words(query)
            scored = [(len(words & _words(p.title + " " + p.text)), -i, p) for i, p in enumerate(self.passages)]
            scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
            results.append([Hit(p.id, p.title, p.text, float(score)) for score, _, p in scored[:k]])
        return results
