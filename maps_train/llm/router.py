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
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.budget import ReasoningCap
from maps_train.llm.common import adapter_dir
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import BackendConfig, Recipe, RoleRoute, route_for

BackendFactory = Callable[[str, str, list[RoleRoute]], Any]
CONCURRENT_KINDS = ("vllm", "openai")  # backends whose generate() may be called from many threads at once


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


def make_backend(kind: str, model: str, routes: list[RoleRoute], config: BackendConfig) -> Any:
    """Build one engine/client for every route that shares it."""
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
    raise MapsTrainError(f"roles: unknown backend '{kind}' (vllm, openai, hf)")


def build_router(recipe: Recipe) -> Router:
    """A lazy router over the recipe's routes: adapter folders are checked now, engines start on first use."""
    for role, route in recipe.roles.items():
        if route.backend not in ("vllm", "openai", "hf"):
            raise MapsTrainError(f"roles.{role}.backend: unknown backend '{route.backend}' (vllm, openai, hf)")
        if route.adapter and route.backend in ("vllm", "hf"):
            adapter_dir(route.adapter, role)
    return Router(recipe, factory=lambda kind, model, routes: make_backend(kind, model, routes, recipe.backend))
