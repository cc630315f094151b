"""Each stage a recipe or suite runs, its processes laid onto the hardware the recipe names.

A recipe runs: the index (built once, then searched in process by every agent run), the teacher's traces (its
routes' engines), training (one `accelerate launch` per adapter, one rank per GPU) and serving (`vllm serve` of
the student with its adapters). A suite runs the index and each system's engines; the suite's engine pool closes a
finished system's engines before one that would not fit beside them starts (maps_train/llm/pool.py), so each
system's engines are counted on their own.

Placement follows the code as it is: a vLLM engine of tensor parallel size tp takes GPUs 0..tp-1 and
gpu_memory_utilization of each; an in-process dense index is cloned to every GPU in fp16, split over them, where
the machine's FAISS is a GPU build (`hardware.faiss_gpu`, `retrieval.faiss_index.to_gpus`), else it is searched in
host memory; its encoder on GPU 0; a training rank takes one GPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions, LoraOptions, SFTOptions
from maps_train.plan import memory
from maps_train.plan.memory import GB
from maps_train.plan.shapes import ModelShape, model_shape
from maps_train.recipe import HardwareConfig, Recipe, adapter_names
from maps_train.retrieval.factory import retriever_key
from maps_train.retrieval.faiss_index import LOAD_CHUNK_ROWS, flat_precision

CORPORA = Path(__file__).with_name("corpora.json")
CPU_ENGINE_RUNTIME_BYTES = 1 * GB  # a vLLM-CPU engine's own use besides weights and its KV cache space


@dataclass
class Row:
    """One process (or one device's sum) of a stage: its peak per device against what it may use there."""

    stage: str
    process: str
    where: str
    per_device: float
    budget: float
    note: str = ""
    problem: str | None = None


@dataclass
class Plan:
    name: str
    hardware: HardwareConfig
    rows: list[Row] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [row.problem for row in self.rows if row.problem]


def _gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def _gpus(first: int, count: int) -> str:
    return f"GPU {first}" if count == 1 else f"GPU {first}-{first + count - 1}"


# ---- the index ----------------------------------------------------------------------------------------------

def corpus_passages(cfg) -> tuple[int, str]:
    """Passages in the corpus: the index manifest's count, the shipped count of a known corpus, or the file's lines."""
    if cfg.index_dir and (Path(cfg.index_dir) / "manifest.json").is_file():
        manifest = json.loads((Path(cfg.index_dir) / "manifest.json").read_text(encoding="utf-8"))
        return int(manifest["count"]), f"{cfg.index_dir}/manifest.json"
    known = json.loads(CORPORA.read_text(encoding="utf-8"))
    if Path(cfg.corpus).name in known:
        return known[Path(cfg.corpus).name]["passages"], str(CORPORA.name)
    path = Path(cfg.corpus)
    if path.is_file():
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip()), str(path)
    raise MapsTrainError(f"retrieval.corpus: {cfg.corpus} is not here, not a known corpus ({', '.join(known)}) "
                         f"and retrieval.index_dir has no manifest.json: its size is unknown")


@dataclass(frozen=True)
class IndexLoad:
    gpu_each: float  # per GPU (the fp16 shard and FAISS's temporary memory)
    encoder: float  # on GPU 0 (or the host)
    host: float  # in host memory while searching: the fp16 flat index (one fp32 chunk with FAISS on GPUs), or
    # the hnsw/compressed index
    build_host: float  # in host memory while `index build` writes it (a flat index is written in fp32)
    note: str
    search_note: str = ""  # the note of the searched index (a flat one's precision)


def index_load(cfg, hardware: HardwareConfig) -> IndexLoad | None:
    """What an in-process dense retriever holds; None for BM25 or a retrieval service (elsewhere)."""
    if cfg.service_url or cfg.kind != "dense":
        return None
    passages, counted = corpus_passages(cfg)
    encoder = model_shape(cfg.encoder)
    dim = encoder.hidden_size
    # counted as a decoder layer stack (a gated MLP), which overstates a BERT encoder by a quarter: a few hundred MB
    encoder_bytes = encoder.parameters() * (memory.BF16 if cfg.fp16 else memory.FP32) + 0.5 * GB
    if cfg.index_type == "ivfpq":
        host = memory.ivfpq_index_bytes(passages, dim, cfg.ivf_nlist, cfg.pq_m)
        gpu = host
    elif cfg.index_type == "hnsw":
        host = memory.flat_index_bytes(passages, dim, memory.FP32) + passages * cfg.hnsw_m * 2 * 4
        gpu = 0.0  # FAISS has no GPU HNSW: it stays in host memory
    else:  # split over the GPUs from the fp16 embeddings, or in host memory in fp32 where half the host holds it,
        # else fp16 (retrieval/dense.py, faiss_index.flat_precision)
        gpu = memory.flat_index_bytes(passages, dim, memory.BF16)
        precision = flat_precision(passages, dim, hardware.memory_gb * GB, cfg.flat_precision)
        host = memory.flat_index_bytes(passages, dim, memory.FP32 if precision == "fp32" else memory.BF16)
        if hardware.faiss_gpu and hardware.gpus:
            host = LOAD_CHUNK_ROWS * dim * memory.FP32
    if not hardware.faiss_gpu:  # faiss-cpu: the index stays in host memory
        gpu = 0.0
    build_host = memory.flat_index_bytes(passages, dim, memory.FP32) if cfg.index_type == "flat" else host
    gpu_each = gpu / hardware.gpus + memory.FAISS_TEMP_BYTES if hardware.gpus and gpu else 0.0
    note = f"{passages:,} passages x {dim} ({counted}), {cfg.index_type}"
    searched = note
    if cfg.index_type == "flat" and not gpu:
        searched += (" fp32 (BLAS search: the host holds it)" if precision == "fp32" else
                     " fp16 (fp32 would take over half the host)")
    return IndexLoad(gpu_each, encoder_bytes, host, build_host, note, searched)


def index_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    cfg = recipe.retrieval
    if cfg.service_url:
        return [Row("index", "retrieval service", cfg.service_url, 0, 0, "searched over HTTP: sized where it runs")]
    if cfg.kind != "dense":
        return [Row("index", "BM25 (bm25s, memory-mapped)", "host", 0, hardware.memory_gb * GB, "not modelled")]
    load = index_load(cfg, hardware)
    passages, _ = corpus_passages(cfg)
    memmap = memory.flat_index_bytes(passages, model_shape(cfg.encoder).hidden_size, memory.BF16)
    where = "GPU 0" if hardware.gpus else "host"
    rows = [Row("index build", f"encoder {cfg.encoder}", where, load.encoder,
                hardware.gpu_memory_gb * GB if hardware.gpus else hardware.memory_gb * GB,
                f"embeddings memmap (fp16) on disk: {_gb(memmap)}")]
    rows.append(_host_row("index build", "FAISS index (fp32, host)", load.build_host, hardware, load.note,
                          "retrieval.index_type=ivfpq (compressed) or a machine with more memory"))
    if hardware.gpus and load.gpu_each:
        rows.append(Row("index search", "FAISS index (fp16, split over every GPU)", _gpus(0, hardware.gpus),
                        load.gpu_each, hardware.gpu_memory_gb * GB, "beside the engines: see the per-GPU sums"))
    return rows


def _host_row(stage: str, process: str, need: float, hardware: HardwareConfig, note: str = "",
              fix: str = "a machine with more memory (hardware.memory_gb, --memory-gb)") -> Row:
    budget = hardware.memory_gb * GB
    problem = None
    if need > budget:
        problem = (f"{stage}: {process} needs {_gb(need)} of host memory, {_gb(need - budget)} over the "
                   f"{hardware.memory_gb:g} GB of hardware.memory_gb; {fix}")
    return Row(stage, process, "host", need, budget, note, problem)


# ---- engines ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineSpec:
    model: str
    adapters: int
    backend: Any  # BackendConfig
    concurrency: int  # questions in flight on it


def engines_of_recipe(recipe: Recipe) -> list[EngineSpec]:
    """The vLLM engines a recipe's routes start: one per model (and adapter set), as the router groups them."""
    groups: dict[str, set] = {}
    for route in recipe.roles.values():
        if route.backend == "vllm":
            groups.setdefault(route.model, set()).update({route.adapter} if route.adapter else set())
    concurrency = recipe.agent.concurrency or recipe.agent.batch_size
    return [EngineSpec(model, len(adapters), recipe.backend, concurrency) for model, adapters in groups.items()]


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
        return [_cpu_engine_row(stage, engine, shape, hardware)], {}
    budget = backend.gpu_memory_utilization * hardware.gpu_memory_gb * GB
    mem = memory.engine_memory(shape, tensor_parallel=tp, max_model_len=backend.max_model_len,
                               max_loras=engine.adapters, max_lora_rank=backend.max_lora_rank, budget=budget)
    process = f"vLLM {engine.model} (tp {tp}" + (f", {engine.adapters} LoRA" if engine.adapters else "") + ")"
    note = (f"weights {_gb(mem.weights)}, KV {_gb(mem.kv_per_sequence)} per {backend.max_model_len}-token "
            f"sequence: {mem.full_sequences} full-length sequences at once for {engine.concurrency} in flight")
    problem = None
    if tp > hardware.gpus:
        problem = (f"{stage}: {process} needs {tp} GPUs, the hardware has {hardware.gpus}; "
                   f"set {tp_field}={hardware.gpus} or run it on {tp} GPUs (hardware.gpus, --gpus)")
    elif mem.needed > budget:
        wider = next((t for t in (2, 4, 8) if t > tp and t <= hardware.gpus and memory.engine_memory(
            shape, tensor_parallel=t, max_model_len=backend.max_model_len, max_loras=engine.adapters,
            max_lora_rank=backend.max_lora_rank, budget=budget).needed <= budget), None)
        fix = (f"set {tp_field}={wider}" if wider else
               "raise backend.gpu_memory_utilization or lower backend.max_model_len")
        problem = (f"{stage}: {process} needs {_gb(mem.needed)} a GPU (weights, LoRA slots, runtime and one "
                   f"{backend.max_model_len}-token sequence), {_gb(mem.needed - budget)} over its "
                   f"{_gb(budget)} (gpu_memory_utilization {backend.gpu_memory_utilization:g} x "
                   f"{hardware.gpu_memory_gb:g} GB); {fix}")
    from maps_train.llm.pool import place

    where = place(tp, backend.gpu_memory_utilization, beside or [], hardware.gpus) if tp <= hardware.gpus else None
    gpus = sorted(where) if where else list(range(min(tp, hardware.gpus)))
    taken = {gpu: budget for gpu in gpus}
    label = _gpus(gpus[0], tp) if gpus == list(range(gpus[0], gpus[0] + tp)) else "GPU " + ",".join(map(str, gpus))
    return [Row(stage, process, label, mem.needed, budget, note, problem)], taken


def _cpu_engine_row(stage: str, engine: EngineSpec, shape: ModelShape, hardware: HardwareConfig) -> Row:
    """vLLM-CPU: float32 weights (bf16 only where the CPU multiplies it) and a KV space of cpu_kv_cache_gib."""
    backend = engine.backend
    loras = engine.adapters * shape.lora_parameters(backend.max_lora_rank) * memory.FP32
    need = shape.parameters() * memory.FP32 + loras + backend.cpu_kv_cache_gib * 2**30 + CPU_ENGINE_RUNTIME_BYTES
    kv = backend.max_model_len * memory.kv_bytes_per_token(shape, 1)
    return _host_row(stage, f"vLLM-CPU {engine.model}", need, hardware,
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
            key = json.dumps([engine.model, engine.adapters, repr(engine.backend)])
            if key in seen:
                continue  # the same engine, shared (maps_train/llm/pool.py)
            seen.add(key)
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
            rows.append(_host_row(stage, process, index_copies * load.host, hardware, load.search_note))
        else:
            host += index_copies * (load.host + load.encoder)
    if not hardware.gpus:
        if host:
            rows.append(_host_row(stage, "all processes (host)", host, hardware))
        return rows
    capacity = hardware.gpu_memory_gb * GB
    for first, count, used in _runs([per_gpu.get(gpu, 0.0) for gpu in range(hardware.gpus)]):
        problem = None
        if used > capacity:
            holds = f"holds {_gb(used)}" if count == 1 else f"hold {_gb(used)} each"
            index = f"the index split over {hardware.gpus} GPUs, " if load is not None and load.gpu_each else ""
            problem = (f"{stage}: {_gpus(first, count)} {holds} (engines at their "
                       f"gpu_memory_utilization, {index}the encoder on GPU 0), "
                       f"{_gb(used - capacity)} over {hardware.gpu_memory_gb:g} GB; lower "
                       f"backend.gpu_memory_utilization or search through `maps-train retrieve serve` elsewhere "
                       f"(retrieval.service_url)")
        rows.append(Row(stage, "all of the above, summed", _gpus(first, count), used, capacity, "", problem))
    return rows


def _runs(values: list[float]) -> list[tuple[int, int, float]]:
    """(first, count, value) for each run of equal neighbours: GPUs that hold the same are one row."""
    runs: list[tuple[int, int, float]] = []
    for index, value in enumerate(values):
        if runs and abs(runs[-1][2] - value) < 1e6:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
        else:
            runs.append((index, 1, value))
    return runs


# ---- training -----------------------------------------------------------------------------------------------

def accelerate_settings(recipe: Recipe, hardware: HardwareConfig,
                        num_machines: int | None = None) -> tuple[int, int, str, int]:
    """(ranks on each machine, ZeRO stage, what says so, machines): train.accelerate_config's num_processes (which
    counts every machine's ranks) over its num_machines (or `num_machines`, `maps-train train --num-machines`), or,
    where it sets none, one rank per GPU as `maps-train train` launches it (maps_train/train/launch.py); without a
    config, train.num_processes. The hardware is one machine's: the plan is per machine."""
    from maps_train.config.yaml_io import read_yaml

    path = recipe.train.accelerate_config
    if not path:
        return recipe.train.num_processes, 0, "train.num_processes", num_machines or 1
    if not Path(path).is_file():
        raise MapsTrainError(f"train.accelerate_config: {path} not found (relative to the working directory)")
    config = read_yaml(path)
    zero = 0
    if config.get("distributed_type") == "DEEPSPEED":
        zero = int((config.get("deepspeed_config") or {}).get("zero_stage", 0))
    machines = num_machines or int(config.get("num_machines") or 1)
    ranks = config.get("num_processes")
    if isinstance(ranks, int) and ranks > 0:
        each = -(-ranks // machines)
        said = f"{path} (num_processes" + (f" {ranks} over {machines} machines)" if machines > 1 else ")")
        return each, zero, said, machines
    return max(hardware.gpus, 1), zero, f"{path} (one rank a GPU)", machines


def train_rows(recipe: Recipe, hardware: HardwareConfig, num_machines: int | None = None) -> list[Row]:
    """One row for every adapter: they train one launch after another with the same settings, so the same sizes.
    Over several machines, each machine's ranks against its own GPUs (ZeRO shards over every rank)."""
    sft, lora = SFTOptions.of(recipe.train.sft), LoraOptions.of(recipe.train.lora)
    shape = model_shape(recipe.train.student)
    world, zero, said, machines = accelerate_settings(recipe, hardware, num_machines)
    on_gpu = hardware.gpus > 0
    settings = dict(max_length=int(sft.max_length), lora_rank=int(lora.r), lora_dropout=float(lora.lora_dropout),
                    checkpointing=bool(sft.gradient_checkpointing), bf16=on_gpu and bool(sft.bf16),
                    world=world * machines, zero_stage=zero, on_gpu=on_gpu)
    batch = int(sft.per_device_train_batch_size)
    need = memory.train_memory(shape, batch=batch, **settings)
    stage = f"train {', '.join(adapter_names(recipe))}"
    process = (f"{world} x rank {recipe.train.student} LoRA r{settings['lora_rank']}" + (f" ZeRO-{zero}" if zero else "")
               + (f", each of {machines} machines" if machines > 1 else ""))
    note = (f"weights {_gb(need.weights)}, activations {_gb(need.activations)} ({batch} x {settings['max_length']} "
            f"tokens, checkpointing {'on' if settings['checkpointing'] else 'off'}), fused LM head {_gb(need.lm_head)}")
    if not on_gpu:
        return [_host_row(stage, process, world * need.total, hardware, note)]
    budget = hardware.gpu_memory_gb * GB
    problem = _train_refusal(stage, recipe, shape, need, budget, batch, settings) if need.total > budget else None
    rows = [Row(stage, process, _gpus(0, min(world, hardware.gpus)), need.total, budget, note, problem)]
    if world > hardware.gpus:
        rows.append(Row(stage, f"accelerate: {world} ranks", _gpus(0, hardware.gpus), 0, 0, said,
                        f"{stage}: {said} starts {world} ranks, one a GPU, on a machine whose hardware has "
                        f"{hardware.gpus}; set num_processes: {hardware.gpus * machines} there or run on machines of "
                        f"{world} GPUs"))
    return rows


def _train_refusal(stage, recipe, shape, need, budget, batch, settings) -> str:
    """What does not fit, by how much, and the change that makes it fit (checkpointing, then a smaller batch)."""
    accumulation = SFTOptions.of(recipe.train.sft).gradient_accumulation_steps
    head = (f"{stage}: {recipe.train.student} at batch {batch} x {settings['max_length']} tokens needs "
            f"{_gb(need.total)} a GPU, {_gb(need.total - budget)} over {_gb(budget)} (activations "
            f"{_gb(need.activations)}, fused LM head {_gb(need.lm_head)})")
    changes = _change_that_fits(lambda rows, kept: memory.train_memory(shape, batch=rows, **kept).total, budget,
                                batch, accumulation, settings, "train.sft")
    if changes is not None:
        same = " (the same effective batch)" if any("per_device_train_batch_size" in c for c in changes) else ""
        return f"{head}; set {' '.join(changes)}{same}"
    return (f"{head}; even batch 1 with checkpointing does not fit: use ZeRO-3 (recipes/accelerate/zero3.yaml) "
            f"or a shorter train.sft.max_length")


def _change_that_fits(need_of, budget: float, batch: int, accumulation: int, settings: dict,
                      section: str) -> list[str] | None:
    """The first overrides of `section` (train.sft, rl.grpo) under which `need_of(rows, settings)` fits `budget`:
    checkpointing on, then the largest divisor of the batch with the accumulation raised to match (the rows an
    optimizer step sees stay the same); None when even one row does not fit."""
    checkpointed = dict(settings, checkpointing=True)
    for smaller in (b for b in range(batch, 0, -1) if batch % b == 0):
        if need_of(smaller, checkpointed) <= budget:
            changes = [] if settings["checkpointing"] else [f"{section}.gradient_checkpointing=true"]
            if smaller != batch:
                changes += [f"{section}.per_device_train_batch_size={smaller}",
                            f"{section}.gradient_accumulation_steps={accumulation * batch // smaller}"]
            return changes
    return None


# ---- serving ------------------------------------------------------------------------------------------------

def serve_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """`maps-train serve`: the student and its adapters at the student's own tensor parallelism and share of each
    GPU (`serve.gpu_memory_utilization`, else the backend's: what `vllm serve --gpu-memory-utilization` gets)."""
    base = recipe.serve.base_model or recipe.train.student
    backend = replace(recipe.backend, tensor_parallel_size=recipe.serve.tensor_parallel_size,
                      gpu_memory_utilization=recipe.serve.gpu_memory_utilization
                      or recipe.backend.gpu_memory_utilization)
    engine = EngineSpec(base, len(adapter_names(recipe)), backend, recipe.agent.concurrency or recipe.agent.batch_size)
    rows, _ = engine_rows("serve", engine, hardware, "serve.tensor_parallel_size")
    if recipe.serve.gpu_memory_utilization and rows[0].problem:
        rows[0].problem = rows[0].problem.replace("raise backend.gpu_memory_utilization",
                                                  "raise serve.gpu_memory_utilization")
    return rows


# ---- RL --------------------------------------------------------------------------------------------------------

def rl_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """`maps-train rl`: what one training rank holds on its GPU (each rank the same; one rank runs on GPU 0).

    The GRPO step: the student with its LoRA trained (fp32 weights, gradients, Adam) and, from a distilled adapter
    with beta > 0, TRL's frozen "ref" copy of it; activations for per_device_train_batch_size rows of the context
    the prompts are fitted to (rl.grpo.vllm_max_model_length, else backend.max_model_len); TRL's fused LM head over the scored
    completion positions only. Beside it, TRL's colocated engine (rl.rollout vllm, vllm_mode colocate) takes
    vllm_gpu_memory_utilization of the GPU, and an in-process environment engine (rl.environment distilled: the
    student with its adapters; recipe: the recipe's vLLM routes) its own gpu_memory_utilization. An environment
    on `maps-train serve` (server) and TRL's `vllm_mode: server` engine run elsewhere: plan them on their own."""
    rl, grpo, lora = recipe.rl, GRPOOptions.of(recipe.rl.grpo), LoraOptions.of(recipe.train.lora)
    shape = model_shape(recipe.train.student)
    on_gpu = hardware.gpus > 0
    batch = int(grpo.per_device_train_batch_size)
    context = int(grpo.vllm_max_model_length or recipe.backend.max_model_len)
    settings = dict(max_length=context, lora_rank=int(lora.r), lora_dropout=float(lora.lora_dropout),
                    checkpointing=bool(grpo.gradient_checkpointing), bf16=on_gpu and bool(grpo.bf16),
                    world=1, zero_stage=0, on_gpu=on_gpu)
    need = _grpo_memory(recipe, shape, batch, settings)
    stage = f"rl {', '.join(rl.roles)}"
    process = f"GRPO rank {recipe.train.student} LoRA r{settings['lora_rank']}"
    note = (f"weights {_gb(need.weights)}, LoRA + ref {_gb(need.lora_states)}, activations {_gb(need.activations)} "
            f"({batch} x {context} tokens, checkpointing {'on' if settings['checkpointing'] else 'off'}), fused LM head "
            f"{_gb(need.lm_head)} ({batch} x {rl.max_completion_tokens} completion tokens scored)")
    colocated = rl.rollout == "vllm" and grpo.vllm_mode == "colocate"
    environment = _environment_engines(recipe)
    # The machine's ranks search one `maps-train retrieve serve` (rl/shared_retrieval.py): one index in host
    # memory for them all, its encoder on GPU 0; a named service (retrieval.service_url) or BM25: nothing here.
    load = index_load(recipe.retrieval, hardware)
    index_rows_ = [] if load is None else [_host_row(
        stage, "retrieval service for the machine's ranks (FAISS index)", load.host, hardware,
        load.search_note + (f"; its encoder on GPU 0: {_gb(load.encoder)}" if on_gpu else ""))]
    encoder_on_0 = load.encoder if load is not None and on_gpu else 0.0
    if not on_gpu:
        policy_engine = EngineSpec(recipe.train.student, 0, replace(recipe.backend, max_model_len=context,
                                                                    tensor_parallel_size=1), batch)
        rows = [_host_row(stage, process, need.total, hardware, note)]
        host = need.total
        labelled = ([(stage, policy_engine)] if colocated else []) + [(f"{stage} (environment)", e) for e in environment]
        for label, engine in labelled:
            rows.append(_cpu_engine_row(label, engine, model_shape(engine.model), hardware))
            host += rows[-1].per_device
        if load is not None:
            rows += index_rows_
            host += load.host + load.encoder
        if len(rows) > 1:
            rows.append(_host_row(stage, "all of the above, summed", host, hardware))
        return rows
    capacity = hardware.gpu_memory_gb * GB
    rows = [Row(stage, process, "each training GPU", need.total, capacity, note)]
    engine_budget = 0.0
    if colocated:
        utilization = float(grpo.vllm_gpu_memory_utilization)
        engine_budget = utilization * capacity
        engine = memory.engine_memory(shape, tensor_parallel=1, max_model_len=context, max_loras=0,
                                      max_lora_rank=recipe.backend.max_lora_rank, budget=engine_budget)
        problem = None
        if engine.needed > engine_budget:
            problem = (f"{stage}: TRL's colocated engine needs {_gb(engine.needed)} (weights, runtime and one "
                       f"{context}-token sequence), {_gb(engine.needed - engine_budget)} over its "
                       f"{_gb(engine_budget)} (rl.grpo.vllm_gpu_memory_utilization {utilization:g} x "
                       f"{hardware.gpu_memory_gb:g} GB); raise rl.grpo.vllm_gpu_memory_utilization or lower "
                       f"rl.grpo.vllm_max_model_length")
        rows.append(Row(stage, f"TRL's colocated vLLM {recipe.train.student} (LoRA merged)", "each training GPU",
                        engine.needed, engine_budget, f"weights {_gb(engine.weights)}, KV {_gb(engine.kv_per_sequence)} "
                        f"per {context}-token sequence: {engine.full_sequences} full-length sequences at once",
                        problem))
    rows += index_rows_
    environment_on: dict[int, float] = {}  # what the environment's engines take of each GPU
    for spec in environment:
        engine_rows_, taken = engine_rows(f"{stage} (environment)", spec, hardware)
        rows += engine_rows_
        for gpu, used in taken.items():
            environment_on[gpu] = environment_on.get(gpu, 0.0) + used
    for gpu in sorted({0, *environment_on}):
        # the rank and TRL's engine sit on GPU 0 (on each training GPU); the environment where its engines are
        rank, colocated_on = (need.total, engine_budget) if gpu == 0 else (0.0, 0.0)
        others = environment_on.get(gpu, 0.0)
        encoder = encoder_on_0 if gpu == 0 else 0.0
        used = rank + colocated_on + others + encoder
        where = "each training GPU" if gpu == 0 and not environment else f"GPU {gpu}"
        problem = None
        if used > capacity:
            problem = _rl_refusal(stage, recipe, shape, settings, batch, where, capacity, rank, colocated_on, others,
                                  encoder)
        rows.append(Row(stage, "all of the above, summed", where, used, capacity, "", problem))
    return rows


def _grpo_memory(recipe: Recipe, shape: ModelShape, batch: int, settings: dict) -> memory.TrainMemory:
    """One GRPO rank: `train_memory`'s LoRA step, plus TRL's "ref" adapter; TRL's fused LM head scores the
    completion positions only (GRPOTrainer labels the prompt -100)."""
    rl = recipe.rl
    need = memory.train_memory(shape, batch=batch, scored=batch * min(rl.max_completion_tokens, settings["max_length"]),
                               **settings)
    reference = 0.0
    if rl.init == "distilled" and float(GRPOOptions.of(rl.grpo).beta) > 0:  # a fresh LoRA's reference is the base
        reference = shape.lora_parameters(settings["lora_rank"]) * memory.FP32
    return replace(need, lora_states=need.lora_states + reference)


def _environment_engines(recipe: Recipe) -> list[EngineSpec]:
    """The environment's in-process vLLM engines (`rl.environment`): distilled, the student with its adapters
    at the student's tensor parallelism (as `serve_rows`); recipe, the recipe's own vLLM routes; server, none."""
    if recipe.rl.environment == "recipe":
        return engines_of_recipe(recipe)
    if recipe.rl.environment == "server":
        return []
    backend = replace(recipe.backend, tensor_parallel_size=recipe.serve.tensor_parallel_size)
    base = recipe.serve.base_model or recipe.train.student
    return [EngineSpec(base, len(adapter_names(recipe)), backend, recipe.agent.concurrency or recipe.agent.batch_size)]


def _rl_refusal(stage, recipe, shape, settings, batch, where, capacity, rank, engine_budget, others,
                encoder=0.0) -> str:
    """By how much a GPU is over (the GRPO rank `rank`, TRL's engine and the environment's engines `others`
    summed), and the first change that fits: checkpointing, then fewer rows a device (the same rows a step through
    gradient accumulation), then smaller engines. A GPU without the rank holds environment engines only."""
    used = rank + engine_budget + others + encoder
    parts = ([f"the GRPO step at {batch} x {settings['max_length']} tokens {_gb(rank)}"] if rank else []) + \
            ([f"TRL's colocated engine {_gb(engine_budget)}"] if engine_budget else []) + \
            ([f"the environment's engine {_gb(others)}"] if others else []) + \
            ([f"the retrieval service's encoder {_gb(encoder)}"] if encoder else [])
    head = f"{stage}: {where} holds {_gb(used)} ({', '.join(parts)}), {_gb(used - capacity)} over {_gb(capacity)}"
    if not rank:
        return f"{head}; lower backend.gpu_memory_utilization or serve the environment (rl.environment: server)"
    accumulation = GRPOOptions.of(recipe.rl.grpo).gradient_accumulation_steps
    room = capacity - engine_budget - others - encoder
    changes = _change_that_fits(lambda rows, kept: _grpo_memory(recipe, shape, rows, kept).total, room, batch,
                                accumulation, settings, "rl.grpo")
    if changes is not None:
        same = " (the same rows a step)" if any("per_device_train_batch_size" in c for c in changes) else ""
        return f"{head}; set {' '.join(changes)}{same}"
    return (f"{head}; even one row with checkpointing does not fit beside the engines: lower "
            f"rl.grpo.vllm_gpu_memory_utilization or rl.grpo.vllm_max_model_length, or serve the environment "
            f"(rl.environment: server)")


# ---- recipes and suites -------------------------------------------------------------------------------------

def with_hardware(hardware: HardwareConfig, gpus: int | None, gpu_memory_gb: float | None,
                  memory_gb: float | None) -> HardwareConfig:
    """The recipe's hardware with the command line's values over it."""
    chosen = {key: value for key, value in
              (("gpus", gpus), ("gpu_memory_gb", gpu_memory_gb), ("memory_gb", memory_gb)) if value is not None}
    return replace(hardware, **chosen)


def plan_recipe(recipe: Recipe, hardware: HardwareConfig, name: str, trains: bool = True,
                reinforces: bool = False, base: str | None = None) -> Plan:
    """Index, the agent on the recipe's routes (traces; eval of this recipe), and, when it `trains` (the file or
    its base writes a `train:` section), training and serving its student; when it `reinforces` (an `rl:`
    section), the RL stage. A student overlay that changes nothing of its `base`'s index and agent (`base` given)
    leaves those two to the base's own plan: they run once, from the base (`maps-train traces BASE`)."""
    plan = Plan(name, hardware)
    if base is None:
        plan.rows += index_rows(recipe, hardware)
        plan.rows += agent_stage("traces/eval", [recipe], hardware)
    else:
        plan.rows.append(Row("index, traces", "as in its base recipe", "-", 0, 0,
                             f"planned with the base: maps-train plan {base}"))
    if trains:
        plan.rows += train_rows(recipe, hardware)
        plan.rows += serve_rows(recipe, hardware)
    if reinforces:
        plan.rows += rl_rows(recipe, hardware)
    return plan


def suite_recipes(path: Path, overrides: list[str]) -> tuple[Any, list[Recipe]]:
    """The suite and each system's recipe with the routes it asks for (adapters need not exist yet)."""
    from maps_train.evaluate.suite import apply_routes, load_suite, resolve_recipe_path
    from maps_train.recipe import load_recipe

    suite = load_suite(path, overrides)
    recipes = []
    for index, spec in enumerate(suite.systems):
        recipe_path = resolve_recipe_path(spec.recipe, path, f"systems[{index}].recipe")
        recipes.append(apply_routes(load_recipe(str(recipe_path), spec.overrides), spec.routes))
    return suite, recipes


def largest_hardware(recipes: list[Recipe]) -> HardwareConfig:
    """A suite runs on the largest machine its recipes name (most GPUs, then the most memory)."""
    return max((r.hardware for r in recipes), key=lambda h: (h.gpus, h.gpu_memory_gb, h.memory_gb))


def plan_suite(path: Path, overrides: list[str], gpus=None, gpu_memory_gb=None, memory_gb=None) -> Plan:
    suite, recipes = suite_recipes(path, overrides)
    return plan_systems(suite, recipes, gpus, gpu_memory_gb, memory_gb)


def plan_systems(suite: Any, recipes: list[Recipe], gpus=None, gpu_memory_gb=None, memory_gb=None) -> Plan:
    """The plan of a loaded suite (`suite_recipes`): the index, then each system's engines."""
    hardware = with_hardware(largest_hardware(recipes), gpus, gpu_memory_gb, memory_gb)
    plan = Plan(suite.name, hardware)
    plan.rows += index_rows(recipes[0], hardware)
    # one retriever per distinct retrieval config, shared by every run of the suite (retrieval.factory.RetrieverPool)
    copies = len({retriever_key(recipe.retrieval) for recipe in recipes})
    # The suite's engine pool (maps_train/llm/pool.py) closes a finished system's engines before one that would
    # not fit beside them starts, and a run waits while running systems hold the GPUs it needs: so each system's
    # own engines must fit (with the index), not all of the suite's at once. Systems on the same engines: one row.
    groups: dict[str, list[str]] = {}
    first: dict[str, Recipe] = {}
    for spec, recipe in zip(suite.systems, recipes):
        key = json.dumps([[e.model, e.adapters, repr(e.backend)] for e in engines_of_recipe(recipe)])
        groups.setdefault(key, []).append(spec.name)
        first.setdefault(key, recipe)
    for key, names in groups.items():
        stage = f"eval {names[0]}" + (f" (+{len(names) - 1} with engines of the same size)" if len(names) > 1 else "")
        plan.rows += agent_stage(stage, [first[key]], hardware, index_copies=copies)
    return plan


def is_suite(path: Path) -> bool:
    from maps_train.config.yaml_io import read_yaml

    return "systems" in read_yaml(path)


def make_plan(path: str, overrides: list[str], gpus=None, gpu_memory_gb=None, memory_gb=None) -> Plan:
    """The plan of a recipe or a suite file, on the hardware it names with the given values over it."""
    from maps_train.recipe import load_recipe

    source = Path(path)
    if not source.is_file():
        raise MapsTrainError(f"{path}: no such recipe or suite file")
    if is_suite(source):
        return plan_suite(source, overrides, gpus, gpu_memory_gb, memory_gb)
    from maps_train.config.overlays import read_layered

    recipe = load_recipe(path, overrides)
    written = read_layered(source)[0]
    trains = "train" in written or any(o.startswith("train.") for o in overrides)
    reinforces = "rl" in written or any(o.startswith("rl.") for o in overrides)
    return plan_recipe(recipe, with_hardware(recipe.hardware, gpus, gpu_memory_gb, memory_gb), recipe.name, trains,
                       reinforces, student_overlay_base(source, overrides))


# What a student overlay may write and still run its base's index and traces unchanged (the base's own plan covers
# them): the student's stages, and backend.max_lora_rank (read only by engines with adapters: the student's).
STUDENT_KEYS = {"base", "name", "train", "serve", "rl", "onpolicy", "wandb", "sft_data", "hardware"}
STUDENT_OVERRIDES = tuple(f"{key}." for key in STUDENT_KEYS) + ("backend.max_lora_rank=",)


def student_overlay_base(source: Path, overrides: list[str]) -> str | None:
    """The base recipe (as the file names it) when `source` is a student overlay whose index and agent are its
    base's, unchanged; None when it plans them itself."""
    from maps_train.config.yaml_io import read_yaml

    own = read_yaml(source)
    if not own.get("base") or set(own) - STUDENT_KEYS - {"backend"}:
        return None
    if set(own.get("backend") or {}) - {"max_lora_rank"}:
        return None
    if any(not override.startswith(STUDENT_OVERRIDES) for override in overrides):
        return None
    return os.path.relpath(os.path.normpath(source.parent / own["base"]))


def format_plan(plan: Plan) -> str:
    """The plan as a fixed-width table."""
    hw = plan.hardware
    machine = (f"{hw.gpus} x {hw.gpu_memory_gb:g} GB GPU, " if hw.gpus else "CPUs only, ") + f"{hw.memory_gb:g} GB host"
    header = ("stage", "process", "where", "per device", "of", "fits", "notes")
    lines = [(r.stage, r.process, r.where, _gb(r.per_device), _gb(r.budget), "no" if r.problem else "yes", r.note)
             for r in plan.rows]
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header) - 1)]
    out = [f"plan: {plan.name} on {machine}"]
    for row in [header, *lines]:
        out.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in out) + "\n"
