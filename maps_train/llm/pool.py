"""Engines shared across routers: the systems of an eval suite that run on the same base share one engine, and an
engine is closed before one that would not fit beside it starts.

A vLLM engine takes tens of seconds and gigabytes to start; a suite with a teacher, three baselines and an ablation
on one model should start it once. Each run leases its recipe's engines: `with pool.lease(recipe) as router`
gives a Router whose engines come from the pool, keyed by backend kind, model, adapter set and engine settings;
`close()` frees them all at the end. Routers built here must not be closed themselves (their engines are the pool's).

Placement, as `maps-train plan` lays it out (`place`): a vLLM engine on GPUs with tensor parallel size tp takes
`gpu_memory_utilization` of tp GPUs: the lowest-numbered GPUs no engine uses when there are tp of them (a teacher
on GPUs 0-3, then a student on GPU 4 beside it), else the lowest-numbered ones with room; it is started with
CUDA_VISIBLE_DEVICES naming them (`visible_gpus`). Where the GPU count is unknown (`gpus` not given and torch sees
none) it takes GPUs 0..tp-1. An engine on CPUs (hf, vLLM-CPU) or an openai client takes no GPU share.
The rule: no GPU holds more than 1.0 of its memory, each engine counted at its footprint (`engine_footprint`):
its gpu_memory_utilization plus its process's CUDA context, which lies outside that share. vLLM starts an engine
only where the GPU's free memory, read after the engine's own CUDA context is up, is at least utilization x total
(`request_memory` in vllm/v1/worker/utils.py), so two engines at 0.45 + 0.55 on one GPU do not both start: the
second finds 0.55 x total less two contexts free. Before a lease's new engines are counted in, idle engines (no
lease holds them: their systems' runs are done) that sit on an over-full GPU are closed, least recently used first
(a system run again later starts its engine again); if the engines still leased would not leave room, the lease
waits until running systems release theirs. An engine is never closed while a lease holds it, and an engine with
no GPU share is never closed before `close()` (closing it would free no GPU). A lease whose engines would not fit
even alone is a one-line error (`maps-train plan` shows by how much).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from maps_train.config.yaml_io import to_dict
from maps_train.errors import MapsTrainError
from maps_train.llm.router import Router, any_thinking, engine_key, make_backend
from maps_train.recipe import BackendConfig, Recipe, RoleRoute

GpuShare = dict[int, float]  # GPU index -> fraction of its memory an engine takes
EngineFactory = Callable[[str, str, list[RoleRoute], BackendConfig], Any]  # make_backend's signature
FULL = 1.0 + 1e-9  # shares are sums of recipe floats: no rounding may refuse an exact fit
# What one vLLM engine holds on each of its GPUs outside its gpu_memory_utilization share: the CUDA context of its
# worker process (PyTorch's context with CUDA's lazy module loading, cuBLAS handles, NCCL's communicator), which is
# up before vLLM reads the free memory it checks against utilization x total (`Worker.init_device` takes that
# `MemorySnapshot` after NCCL; vllm/v1/worker/gpu_worker.py). An estimate, rounded up: vLLM states no figure;
# users report a second engine refused on the first one's context (vllm-project/vllm#19125, #14376).
# bench/gpu_day_one.py measures a torch process's context on the GPU ("CUDA context" row).
ENGINE_CONTEXT_BYTES = 1.0e9
DEFAULT_GPU_BYTES = 80e9  # the recipes' hardware.gpu_memory_gb where no GPU says otherwise


def engine_footprint(utilization: float, gpu_bytes: float) -> float:
    """The fraction of a GPU of `gpu_bytes` one vLLM engine holds: its share plus its CUDA context."""
    return utilization + ENGINE_CONTEXT_BYTES / gpu_bytes


def gpu_share(kind: str, config: BackendConfig, on_gpu: bool, gpu_bytes: float = DEFAULT_GPU_BYTES) -> GpuShare:
    """What an engine takes of each GPU: vLLM on GPUs takes gpu_memory_utilization of GPUs 0..tp-1, plus its CUDA
    context (`engine_footprint`)."""
    if kind != "vllm" or not on_gpu:
        return {}
    footprint = engine_footprint(config.gpu_memory_utilization, gpu_bytes)
    return {gpu: footprint for gpu in range(config.tensor_parallel_size)}


def place(tp: int, fraction: float, shares: list[GpuShare], gpus: int) -> GpuShare | None:
    """Where an engine taking `fraction` of `tp` GPUs goes beside engines holding `shares`, on `gpus` GPUs: the
    lowest-numbered unused GPUs when tp of them are free, else the lowest-numbered GPUs with room; None when fewer
    than tp GPUs have room. With `gpus` 0 (unknown), GPUs 0..tp-1 whatever they hold (the caller checks the fit)."""
    if gpus <= 0:
        return {gpu: fraction for gpu in range(tp)}
    used: dict[int, float] = {}
    for share in shares:
        for gpu, taken in share.items():
            used[gpu] = used.get(gpu, 0.0) + taken
    free = [gpu for gpu in range(gpus) if not used.get(gpu)]
    roomy = [gpu for gpu in range(gpus) if used.get(gpu, 0.0) + fraction <= FULL]
    chosen = free[:tp] if len(free) >= tp else roomy[:tp]
    return {gpu: fraction for gpu in chosen} if len(chosen) == tp else None


@contextmanager
def visible_gpus(share: GpuShare) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES naming the GPUs of `share` (through any list already set) while an engine starts: its
    processes see those GPUs only, as 0..tp-1."""
    if not share:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [part.strip() for part in before.split(",")] if before else None
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical[gpu] if physical else str(gpu) for gpu in sorted(share))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def visible_gpu_count() -> int:
    """GPUs this process may use (torch's count, after CUDA_VISIBLE_DEVICES); 0 without CUDA."""
    import torch

    return torch.cuda.device_count()


def visible_gpu_bytes() -> float | None:
    """The memory of the first visible GPU (torch's figure); None without CUDA."""
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.device_count() else None


@dataclass
class _Slot:
    """One engine of the pool: reserved by the first lease that names it, started on first use."""

    share: GpuShare
    engine: Any = None
    leases: int = 0
    last_released: int = 0  # the pool's release counter when the last lease let go: least recently used first


class EnginePool:
    def __init__(self, factory: EngineFactory = make_backend, on_gpu: bool | None = None,
                 gpus: int | None = None, gpu_bytes: float | None = None) -> None:
        """`factory(kind, model, routes_sharing_it, backend_config)` starts an engine (under `visible_gpus` of its
        placement). `on_gpu`: whether vLLM engines run on GPUs; None asks the installed vLLM when the first vLLM
        engine is leased. `gpus`: how many there are to place engines on; None asks torch then. `gpu_bytes`: each
        GPU's memory, which sets the CUDA context's fraction (`engine_footprint`); None asks torch, else takes the
        recipe's hardware.gpu_memory_gb."""
        self._factory = factory
        self._on_gpu = on_gpu
        self._gpus = gpus
        self._gpu_bytes = gpu_bytes
        self._slots: dict[tuple, _Slot] = {}
        self._changed = threading.Condition()  # held while the slots change; notified when a lease lets go
        self._releases = 0
        self.waiting = 0  # leases waiting for running systems to release their GPUs

    def _gpus_in_use(self) -> bool:
        if self._on_gpu is None:
            from maps_train.platform import vllm_on_cpu

            self._on_gpu = not vllm_on_cpu()
        if self._on_gpu and self._gpus is None:
            self._gpus = visible_gpu_count()
        if self._on_gpu and self._gpu_bytes is None and self._gpus:
            self._gpu_bytes = visible_gpu_bytes()
        return self._on_gpu

    def _placed(self, wanted: dict[str, tuple[tuple, GpuShare, str]],
                held: list[GpuShare]) -> dict[tuple, GpuShare] | None:
        """The GPUs each of the lease's new engines takes beside the engines holding `held` (`place`, one after
        another); None when one has no room."""
        shares = list(held)
        placed: dict[tuple, GpuShare] = {}
        for pool_key, share, _ in wanted.values():
            if pool_key in self._slots or pool_key in placed or not share:
                placed.setdefault(pool_key, self._slots[pool_key].share if pool_key in self._slots else share)
                continue
            where = place(len(share), next(iter(share.values())), shares, self._gpus or 0)
            if where is None:
                return None
            placed[pool_key] = where
            shares.append(where)
        return placed

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
            on_gpu = kind == "vllm" and self._gpus_in_use()
            gpu_bytes = self._gpu_bytes or recipe.hardware.gpu_memory_gb * 1e9
            share = gpu_share(kind, recipe.backend, on_gpu, gpu_bytes)
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
            while not (placed := self._make_room(name, wanted)):
                if not told:  # once: every release wakes the waiters up to look again
                    print(f"engine pool: system '{name}' waits for running systems to release their GPUs",
                          file=sys.stderr)
                    told = True
                self.waiting += 1
                try:
                    self._changed.wait()
                finally:
                    self.waiting -= 1
            for pool_key, _, _ in wanted.values():
                slot = self._slots.setdefault(pool_key, _Slot(placed[pool_key]))
                slot.leases += 1

    def _make_room(self, name: str, wanted: dict[str, tuple[tuple, GpuShare, str]]) -> dict[tuple, GpuShare] | None:
        """Place the lease's new engines (`place`): beside every engine when there is room, else after closing idle
        engines, least recently used first; None (nothing closed) when only the end of a running lease can make
        room. Returns each of the lease's engines' GPU share."""
        mine = {pool_key for pool_key, _, _ in wanted.values()}
        kept = [slot.share for key, slot in self._slots.items() if slot.leases or key in mine]
        placed = self._placed(wanted, kept)
        if placed is None or _over_full(kept + [placed[key] for key in mine if key not in self._slots]):
            if any(slot.leases for slot in self._slots.values()):
                return None
            utilization = recipe_utilization(wanted)
            labels = ", ".join(f"{label} at {_placement(share, utilization)}" for _, share, label in wanted.values()
                               if share)
            raise MapsTrainError(
                f"engine pool: system '{name}': its engines ({labels}) do not fit on the GPUs even alone: vLLM starts "
                f"an engine only where the free memory is at least its gpu_memory_utilization x the GPU's, and each "
                f"engine's CUDA context ({ENGINE_CONTEXT_BYTES / 1e9:g} GB) lies outside that share; lower "
                f"backend.gpu_memory_utilization (maps-train plan shows the placement)")
        idle = sorted(((slot.last_released, key) for key, slot in self._slots.items()
                       if not slot.leases and key not in mine and slot.share), key=lambda item: item[0])
        for _, key in [(None, None), *idle]:
            if key is not None:
                self._close(key)
            everyone = [slot.share for slot in self._slots.values()]
            placed = self._placed(wanted, everyone)
            if placed is not None and not _over_full(everyone + [placed[k] for k in mine if k not in self._slots]):
                return placed
        return self._placed(wanted, kept)

    def _engine(self, pool_key: tuple, kind: str, model: str, routes: list[RoleRoute], config: BackendConfig) -> Any:
        with self._changed:  # leased: no other thread closes it; the first use starts it
            slot = self._slots[pool_key]
            if slot.engine is None:
                with visible_gpus(slot.share if self._gpus else {}):
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


def recipe_utilization(wanted: dict[str, tuple[tuple, GpuShare, str]]) -> float | None:
    """The gpu_memory_utilization the lease's engines were sized with (one backend a recipe), for a message."""
    settings = next((pool_key[3] for pool_key, share, _ in wanted.values() if share), None)
    return json.loads(settings).get("gpu_memory_utilization") if settings else None


def _placement(share: GpuShare, utilization: float | None = None) -> str:
    """"0.85 of GPU 0": what an engine takes (its gpu_memory_utilization where given, else its footprint)."""
    gpus = sorted(share)
    where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"
    return f"{utilization if utilization is not None else share[gpus[0]]:g} of {where}"
