"""Engines shared across routers: the systems of an eval suite that run on the same base share one engine.

A vLLM engine takes tens of seconds and gigabytes to start; a suite with a teacher, three baselines and an ablation
on one model should start it once. `EnginePool.router(recipe)` returns a Router whose engines come from the pool,
keyed by backend kind, model, adapter set and engine settings; `close()` frees them all at the end. Routers built
here must not be closed themselves (their engines are the pool's).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from maps_train.config import to_dict
from maps_train.llm.router import Router, any_thinking, make_backend
from maps_train.recipe import Recipe, RoleRoute


class EnginePool:
    def __init__(self) -> None:
        self._engines: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def router(self, recipe: Recipe) -> Router:
        settings = json.dumps(to_dict(recipe.backend), sort_keys=True)

        def factory(kind: str, model: str, routes: list[RoleRoute]) -> Any:
            adapters = tuple(sorted({r.adapter for r in routes if r.adapter}))
            # Thinking is in the key: a vLLM engine's reasoning parser is fixed when it starts (see vllm_backend).
            key = (kind, model, adapters, settings, any_thinking(routes))
            with self._lock:
                if key not in self._engines:
                    self._engines[key] = make_backend(kind, model, routes, recipe.backend)
                return self._engines[key]

        return Router(recipe, factory=factory)

    def __len__(self) -> int:
        return len(self._engines)

    def close(self) -> None:
        for engine in self._engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        self._engines.clear()
