"""The router: role -> route (backend, base model, adapter, sampling) from the recipe, one batched backend call
per engine, completions back in request order, each tagged with its role.

Roles whose routes share a backend kind and base model share one engine (`engine_key`); the openai backend is
one client for every route (the adapter is picked per request with `model=NAME`). Engines are created on first
use and freed by `close()`.

    router = build_router(recipe)
    completions = router.generate([ChatRequest(role="proposer", messages=[...], question_id="q1"), ...])

Tests and benchmarks that already hold an engine pass it in: `Router(routes, backends={"vllm": engine})`.
Cost is booked by the agent engine on each question (`maps_train.records.Cost`), and every call's usage is kept
in the question's trace, so the router keeps no ledger of its own.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.adapter_folders import adapter_dir
from maps_train.llm.budget import ReasoningCap
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import BackendConfig, Recipe, RoleRoute, route_for

BackendFactory = Callable[[str, str, list[RoleRoute]], Any]
CONCURRENT_KINDS = ("vllm", "openai", "annotation")  # backends whose generate() may be called from many threads at once
KINDS = ("vllm", "openai", "hf", "annotation")


def annotation_refusal(recipe: Recipe, where: str = "by this command") -> str | None:
    """The one line refusing a recipe whose routes play a role from the gold annotations (`backend: annotation`),
    which only the traces stage may run; None when no route does."""
    for role, route in recipe.roles.items():
        if route.backend == "annotation":
            return (f"roles.{role}.backend: annotation reads the gold annotations: it writes teacher traces "
                    f"(maps-train traces) and is refused {where}")
    return None


def engine_key(route: RoleRoute) -> str:
    """Routes with the same key share one backend instance."""
    return "openai" if route.backend == "openai" else f"{route.backend}:{route.model}"


class Router:
    def __init__(
        self,
        routes: Mapping[str, RoleRoute] | Recipe,
        backends: Mapping[str, Any] | None = None,
        factory: BackendFactory | None = None,
        reasoning_cap: ReasoningCap | None = None,
    ):
        """`routes`: role -> route ("default" catches other roles), or a recipe. `backends`: ready backends by
        `engine_key` or by backend kind ("vllm", "hf", "openai"); they are not closed by `close()`.
        `factory(kind, model, routes_sharing_it)` builds missing ones on first use. `reasoning_cap`: what happens
        to calls whose reasoning hit max_tokens (default: the recipe's `backend.reasoning_cap`, else "answer")."""
        config = routes.backend if isinstance(routes, Recipe) else BackendConfig()
        self.reasoning_cap = reasoning_cap or ReasoningCap.from_config(config)
        self.routes: dict[str, RoleRoute] = dict(routes.roles if isinstance(routes, Recipe) else routes)
        self._given = dict(backends or {})
        self._factory = factory
        self._built: dict[str, Any] = {}
        self._lock = threading.Lock()  # question threads of the continuous schedule may ask for an engine at once

    @property
    def concurrent(self) -> bool:
        """Every engine behind this router takes `generate` calls from many threads at once (vLLM's engine loop,
        the OpenAI client); otherwise the continuous schedule coalesces calls into one at a time."""
        kinds = {engine_key(route): route.backend for route in self.routes.values()}
        for key, kind in kinds.items():
            given = self._given.get(key, self._given.get(kind))
            if given is not None:
                if not getattr(given, "concurrent", False):
                    return False
            elif kind not in CONCURRENT_KINDS:
                return False
        return True

    def route(self, role: str) -> RoleRoute:
        return route_for(self.routes, role)

    def backend(self, route: RoleRoute) -> Any:
        key = engine_key(route)
        for name in (key, route.backend):
            if name in self._given:
                return self._given[name]
        with self._lock:
            if key not in self._built:
                if self._factory is None:
                    raise MapsTrainError(f"roles: no backend for '{key}' and no factory to build one")
                sharing = [r for r in self.routes.values() if engine_key(r) == key]
                self._built[key] = self._factory(route.backend, route.model, sharing or [route])
            return self._built[key]

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """One batched call per engine (and one more for the calls whose reasoning hit max_tokens, see
        `maps_train.llm.budget`); completions in request order."""
        routes = [self.route(req.role) for req in requests]
        groups: dict[str, list[int]] = defaultdict(list)
        for i, route in enumerate(routes):
            groups[engine_key(route)].append(i)
        results: list[Completion | None] = [None] * len(requests)
        for rows in groups.values():
            backend = self.backend(routes[rows[0]])
            completions = self.reasoning_cap.generate(backend, [requests[i] for i in rows], [routes[i] for i in rows])
            for i, comp in zip(rows, completions):
                comp.role = requests[i].role
                results[i] = comp
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Free the engines this router built (not the ones it was given)."""
        for backend in self._built.values():
            close = getattr(backend, "close", None)
            if close is not None:
                close()
        self._built.clear()


def any_thinking(routes: list[RoleRoute]) -> bool:
    """Some route of an engine thinks: a vLLM engine then starts with a reasoning parser (it is engine-wide)."""
    return any(r.enable_thinking for r in routes)


def make_backend(kind: str, model: str, routes: list[RoleRoute], config: BackendConfig, annotations: Any = None,
                 fallback: Callable[[RoleRoute], Any] | None = None, prompts_dir: str | None = None) -> Any:
    """Build one engine/client for every route that shares it. `annotations` (`maps_train.teachers.Annotations`,
    given by the traces stage alone) build the annotation backend, `fallback` serving the calls it cannot play."""
    if kind == "annotation":
        if annotations is None:
            raise MapsTrainError("roles: backend 'annotation' reads the gold annotations: only maps-train traces "
                                 "builds it")
        return annotations.backend(fallback=fallback, prompts_dir=prompts_dir)
    if kind == "hf":
        from maps_train.llm.hf_backend import HFBackend

        return HFBackend(model, config)
    if kind == "vllm":
        from maps_train.llm.vllm_backend import VLLMBackend

        adapters = sorted({r.adapter for r in routes if r.adapter})
        return VLLMBackend(model, config, max_loras=len(adapters), adapters=adapters, thinking=any_thinking(routes))
    if kind == "openai":
        from maps_train.llm.openai_backend import OpenAIBackend

        return OpenAIBackend(config)
    raise MapsTrainError(f"roles: unknown backend '{kind}' ({', '.join(KINDS)})")


def build_router(recipe: Recipe, annotations: Any = None) -> Router:
    """A lazy router over the recipe's routes: adapter folders are checked now, engines start on first use.

    `annotations`: the questions' gold annotations (`maps_train.teachers.Annotations`), which only the traces stage
    passes; without them a route with `backend: annotation` is refused in one line. Its calls that the annotation
    cannot play go to the route's model, served as `backend: vllm` would serve it, sharing the engine of any route
    of that model."""
    for role, route in recipe.roles.items():
        if route.backend not in KINDS:
            raise MapsTrainError(f"roles.{role}.backend: unknown backend '{route.backend}' ({', '.join(KINDS)})")
        if route.adapter and route.backend in ("vllm", "hf"):
            adapter_dir(route.adapter, role)
    refusal = annotation_refusal(recipe, "outside maps-train traces") if annotations is None else None
    if refusal:
        raise MapsTrainError(refusal)

    def fallback(route: RoleRoute) -> Any:
        return router.backend(replace(route, backend="vllm"))

    def factory(kind: str, model: str, routes: list[RoleRoute]) -> Any:
        return make_backend(kind, model, routes, recipe.backend, annotations, fallback, recipe.agent.prompts_dir)

    router = Router(recipe, factory=factory)
    return router
