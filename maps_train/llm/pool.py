"""Engines shared across routers: the systems of an eval suite that run on the same base share one engine, and an
engine is closed before one that would not fit beside it starts.

A vLLM engine takes tens of seconds and gigabytes to start; a suite with a teacher, three baselines and an ablation
on one model should start it once. Each run leases its recipe's engines: `with pool.lease(recipe) as router`
gives a Router whose engines come from the pool, keyed by backend kind, model, adapter set and engine settings;
`close()` frees them all at the end. Routers built here must not be closed themselves (their engines are the pool's).

Placement, as `maps-train plan` lays it out: a vLLM engine on GPUs with tensor parallel size tp takes GPUs 0..tp-1
and `gpu_memory_utilization` of each; an engine on CPUs (hf, vLLM-CPU) or an openai client takes no GPU share.
The rule: no GPU holds more than 1.0 of its memory. Before a lease's new engines are counted in, idle engines (no
lease holds them: their systems' runs are done) that sit on an over-full GPU are closed, least recently used first
(a system run again later starts its engine again); if the engines still leased would not leave room, the lease
waits until running systems release theirs. An engine is never closed while a lease holds it, and an engine with
no GPU share is never closed before `close()` (closing it would free no GPU). A lease whose engines would not fit
even alone is a one-line error (`maps-train plan` shows by how much).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from maps_train.config import to_dict
from maps_train.errors import MapsTrainError
from maps_train.llm.router import Router, any_thinking, engine_key, make_backend
from maps_train.recipe import BackendConfig, Recipe, RoleRoute

GpuShare = dict[int, float]  # GPU index -> fraction of its memory an engine takes
EngineFactory = Callable[[str, str, list[RoleRoute], BackendConfig], Any]  # make_backend's signature
FULL = 1.0 + 1e-9  # shares are sums of recipe floats (0.45 + 0.55): no rounding may refuse an exact fit


def gpu_share(kind: str, config: BackendConfig, on_gpu: bool) -> GpuShare:
    """What an engine takes of each GPU: vLLM on GPUs takes gpu_memory_utilization of GPUs 0..tp-1."""
    if kind != "vllm" or not on_gpu:
        return {}
    return {gpu: config.gpu_memory_utilization for gpu in range(config.tensor_parallel_size)}


@dataclass
class _Slot:
    """One engine of the pool: reserved by the first lease that names it, started on first use."""

    share: GpuShare
    engine: Any = None
    leases: int = 0
    last_released: int = 0  # the pool's release counter when the last lease let go: least recently used first


class EnginePool:
    def __init__(self, factory: EngineFactory = make_backend, on_gpu: bool | None = None) -> None:
        """`factory(kind, model, routes_sharing_it, backend_config)` starts an engine. `on_gpu`: whether vLLM
        engines run on GPUs; None asks the installed vLLM when the first vLLM engine is leased."""
        self._factory = factory
        self._on_gpu = on_gpu
        self._slots: dict[tuple, _Slot] = {}
        self._changed = threading.Condition()  # held while the slots change; notified when a lease lets go
        self._releases = 0
        self.waiting = 0  # leases waiting for running systems to release their GPUs

    def _gpus_in_use(self) -> bool:
        if self._on_gpu is None:
            from maps_train.platform import vllm_on_cpu

            self._on_gpu = not vllm_on_cpu()
        return self._on_gpu

    def _wanted(self, recipe: Recipe) -> dict[str, tuple[tuple, GpuShare, str]]:
        """The recipe's engines as its Router groups them: engine_key -> (pool key, GPU share, label)."""
        settings = json.dumps(to_dict(recipe.backend), sort_keys=True)
        groups: dict[str, list[RoleRoute]] = {}
        for route in recipe.roles.values():
            groups.setdefault(engine_key(route), []).append(route)
        wanted = {}
        for key, routes in groups.items():
            kind = routes[0].backend
            adapters = tuple(sorted({r.adapter for r in routes if r.adapter}))
            model = "" if kind == "openai" else routes[0].model  # one client for every model behind the servers
            # Thinking is in the key: a vLLM engine's reasoning parser is fixed when it starts (see vllm_backend).
            pool_key = (kind, model, adapters, settings, any_thinking(routes))
            share = gpu_share(kind, recipe.backend, kind == "vllm" and self._gpus_in_use())
            wanted[key] = (pool_key, share, key)
        return wanted

    @contextmanager
    def lease(self, recipe: Recipe) -> Iterator[Router]:
        """A Router over the pool's engines for one run; its engines stay open until the run lets go."""
        wanted = self._wanted(recipe)
        self._acquire(recipe.name, wanted)
        try:
            yield Router(recipe, factory=lambda kind, model, routes: self._engine(
                wanted[engine_key(routes[0])][0], kind, model, routes, recipe.backend))
        finally:
            self._release(wanted)

    def _acquire(self, name: str, wanted: dict[str, tuple[tuple, GpuShare, str]]) -> None:
        with self._changed:
            told = False
            while not self._make_room(name, wanted):
                if not told:  # once: every release wakes the waiters up to look again
                    print(f"engine pool: system '{name}' waits for running systems to release their GPUs",
                          file=sys.stderr)
                    told = True
                self.waiting += 1
                try:
                    self._changed.wait()
                finally:
                    self.waiting -= 1
            for pool_key, share, _ in wanted.values():
                slot = self._slots.setdefault(pool_key, _Slot(share))
                slot.leases += 1

    def _make_room(self, name: str, wanted: dict[str, tuple[tuple, GpuShare, str]]) -> bool:
        """Close idle engines until the lease's new engines fit; False (nothing closed) when only the end of a
        running lease can make room."""
        mine = {pool_key for pool_key, _, _ in wanted.values()}
        new = [(share, label) for pool_key, share, label in wanted.values() if pool_key not in self._slots]
        kept = [slot.share for key, slot in self._slots.items() if slot.leases or key in mine]
        if _over_full(kept + [share for share, _ in new]):
            if any(slot.leases for slot in self._slots.values()):
                return False
            labels = ", ".join(f"{label} at {_placement(share)}" for _, share, label in wanted.values() if share)
            raise MapsTrainError(
                f"engine pool: system '{name}': its engines ({labels}) do not fit on the GPUs even alone; lower "
                f"backend.gpu_memory_utilization (maps-train plan shows the placement)")
        idle = sorted(((slot.last_released, key) for key, slot in self._slots.items()
                       if not slot.leases and key not in mine and slot.share), key=lambda item: item[0])
        for _, key in idle:
            over = _over_full([slot.share for slot in self._slots.values()] + [share for share, _ in new])
            if not over:
                break
            if over & set(self._slots[key].share):
                self._close(key)
        return True

    def _engine(self, pool_key: tuple, kind: str, model: str, routes: list[RoleRoute], config: BackendConfig) -> Any:
        with self._changed:  # leased: no other thread closes it; the first use starts it
            slot = self._slots[pool_key]
            if slot.engine is None:
                slot.engine = self._factory(kind, model, routes, config)
            return slot.engine

    def _release(self, wanted: dict[str, tuple[tuple, GpuShare, str]]) -> None:
        with self._changed:
            self._releases += 1
            for pool_key, _, _ in wanted.values():
                slot = self._slots.get(pool_key)
                if slot is None:  # the pool was closed under it
                    continue
                slot.leases -= 1
                slot.last_released = self._releases
                if not slot.leases and slot.engine is None:  # reserved but never used: nothing to keep
                    del self._slots[pool_key]
            self._changed.notify_all()

    def _close(self, pool_key: tuple) -> None:
        engine = self._slots.pop(pool_key).engine
        close = getattr(engine, "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        """Engines started and not closed."""
        return sum(slot.engine is not None for slot in self._slots.values())

    def close(self) -> None:
        with self._changed:
            for pool_key in list(self._slots):
                self._close(pool_key)


def _over_full(shares: list[GpuShare]) -> set[int]:
    """The GPUs these engines together would fill past their memory."""
    used: dict[int, float] = {}
    for share in shares:
        for gpu, fraction in share.items():
            used[gpu] = used.get(gpu, 0.0) + fraction
    return {gpu for gpu, total in used.items() if total > FULL}


def _placement(share: GpuShare) -> str:
    """"0.85 of GPUs 0-3": what an engine takes, for a message."""
    gpus = sorted(share)
    where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"
    return f"{share[gpus[0]]:g} of {where}"
