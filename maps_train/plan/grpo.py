"""`maps-train rl`: what one GRPO training rank holds on its GPU (each rank the same; one rank runs on GPU 0), and
the engines beside it.

The GRPO step: the student with its LoRA trained (fp32 weights, gradients, Adam) and, from a distilled adapter
with beta > 0, TRL's frozen "ref" copy of it; activations for per_device_train_batch_size rows of the context the
prompts are fitted to (rl.grpo.vllm_max_model_length, else backend.max_model_len); TRL's fused LM head over the
scored completion positions only. Beside it, TRL's colocated engine (rl.rollout vllm, vllm_mode colocate) takes
vllm_gpu_memory_utilization of the GPU, and the environment's in-process engines (`environment_engines`) their own
gpu_memory_utilization. An environment on `maps-train serve` (server) and TRL's `vllm_mode: server` engine run
elsewhere: plan them on their own. The machine's ranks search one `maps-train retrieve serve`
(rl/shared_retrieval.py): one index in host memory for them all, its encoder on GPU 0; a named service
(retrieval.service_url) or BM25: nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from maps_train.adapters import rl_source_set
from maps_train.library_options import GRPOOptions, LoraOptions
from maps_train.plan import memory
from maps_train.plan.engines import EngineSpec, cpu_engine_row, engine_rows, engines_of_routes
from maps_train.plan.index import IndexLoad, index_load
from maps_train.plan.memory import GB
from maps_train.plan.rows import Row, gb, host_row
from maps_train.plan.shapes import ModelShape, model_shape
from maps_train.plan.training import StepSettings, change_that_fits
from maps_train.recipe import HardwareConfig, Recipe
from maps_train.rl.environment import environment_recipe
from maps_train.rl.layout import RoleRun
from maps_train.rl.rollout import policy_routes


@dataclass(frozen=True)
class GRPORank:
    """One GRPO rank as `maps-train rl` runs it, from `rl.grpo` and `train.lora` as the trainer resolves them."""

    student: str
    shape: ModelShape
    settings: StepSettings
    batch: int  # per_device_train_batch_size
    accumulation: int  # gradient_accumulation_steps
    completion_tokens: int  # rl.max_completion_tokens: the positions of a row TRL's fused LM head scores
    reference: bool  # TRL keeps a frozen "ref" copy of the starting adapter (a distilled start, beta > 0)

    def memory(self, batch: int | None = None, settings: StepSettings | None = None) -> memory.TrainMemory:
        """`StepSettings.memory`'s LoRA step, scoring the completion positions only (GRPOTrainer labels the prompt
        -100), plus TRL's "ref" adapter; at another batch or settings for the refusal's advice."""
        batch = self.batch if batch is None else batch
        settings = self.settings if settings is None else settings
        need = settings.memory(self.shape, batch, scored=batch * min(self.completion_tokens, settings.max_length))
        reference = self.shape.lora_parameters(settings.lora_rank) * memory.FP32 if self.reference else 0.0
        return replace(need, lora_states=need.lora_states + reference)


def grpo_rank(recipe: Recipe, hardware: HardwareConfig) -> GRPORank:
    rl, grpo, lora = recipe.rl, GRPOOptions.of(recipe.rl.grpo), LoraOptions.of(recipe.train.lora)
    on_gpu = hardware.gpus > 0
    settings = StepSettings(max_length=int(grpo.vllm_max_model_length or recipe.backend.max_model_len),
                            lora_rank=int(lora.r), lora_dropout=float(lora.lora_dropout),
                            checkpointing=bool(grpo.gradient_checkpointing), bf16=on_gpu and bool(grpo.bf16),
                            world=1, zero_stage=0, on_gpu=on_gpu)
    return GRPORank(recipe.train.student, model_shape(recipe.train.student), settings,
                    int(grpo.per_device_train_batch_size), int(grpo.gradient_accumulation_steps),
                    rl.max_completion_tokens, rl.init == "distilled" and float(grpo.beta) > 0)


def environment_engines(recipe: Recipe) -> list[EngineSpec]:
    """The environment's in-process vLLM engines, as `maps-train rl` builds them: the routes of
    `environment_recipe` (`rl.environment` distilled: the student with its adapters at serve.tensor_parallel_size;
    recipe: the recipe's own routes; server: served, none here) with the trained role's calls sent to the policy
    (`policy_routes`). Roles train one after another, each closing its engines before the next: the role whose
    environment has the most engines, then the most LoRA slots, is planned."""
    concurrency = recipe.agent.concurrency or recipe.agent.batch_size
    adapters, each_role = rl_source_set(recipe), []
    for role in recipe.rl.roles:
        run = RoleRun.of(recipe, role)
        environment, trained = environment_recipe(recipe, adapters), run.trained_roles(adapters)
        routes = policy_routes(environment, trained, "planned")
        each_role.append(engines_of_routes(routes, environment.backend, concurrency))
        adapters = run.with_rl_adapter(adapters, trained)
    return max(each_role, key=lambda engines: (len(engines), sum(e.adapters for e in engines)), default=[])


@dataclass(frozen=True)
class RLStage:
    """What `rl_rows` lays out: the rank, its row, and what runs beside it."""

    name: str
    rank: GRPORank
    need: memory.TrainMemory
    process: str
    note: str
    colocated: bool  # TRL's vLLM engine in the rank's process (rl.rollout vllm, vllm_mode colocate)
    colocated_utilization: float  # rl.grpo.vllm_gpu_memory_utilization
    environment: list[EngineSpec]
    index: IndexLoad | None


def rl_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """The GRPO rank, TRL's colocated engine, the environment's engines and the ranks' retrieval service; per GPU
    summed (on CPUs: in host memory, summed)."""
    rank, grpo = grpo_rank(recipe, hardware), GRPOOptions.of(recipe.rl.grpo)
    need, settings = rank.memory(), rank.settings
    note = (f"weights {gb(need.weights)}, LoRA + ref {gb(need.lora_states)}, activations {gb(need.activations)} "
            f"({rank.batch} x {settings.max_length} tokens, {settings.checkpointing_note()}), fused LM head "
            f"{gb(need.lm_head)} ({rank.batch} x {rank.completion_tokens} completion tokens scored)")
    stage = RLStage(f"rl {', '.join(recipe.rl.roles)}", rank, need,
                    f"GRPO rank {rank.student} LoRA r{settings.lora_rank}", note,
                    recipe.rl.rollout == "vllm" and grpo.vllm_mode == "colocate",
                    float(grpo.vllm_gpu_memory_utilization), environment_engines(recipe),
                    index_load(recipe.retrieval, hardware))
    return _gpu_rows(stage, recipe, hardware) if hardware.gpus else _cpu_rows(stage, recipe, hardware)


def _index_rows(stage: RLStage, hardware: HardwareConfig) -> list[Row]:
    load = stage.index
    if load is None:
        return []
    encoder = f"; its encoder on GPU 0: {gb(load.encoder)}" if hardware.gpus else ""
    return [host_row(stage.name, "retrieval service for the machine's ranks (FAISS index)", load.host, hardware,
                     load.search_note + encoder)]


def _cpu_rows(stage: RLStage, recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """Everything in host memory: the rank, TRL's engine and the environment's on vLLM-CPU, the index."""
    rank = stage.rank
    rows = [host_row(stage.name, stage.process, stage.need.total, hardware, stage.note)]
    host = stage.need.total
    policy = EngineSpec(rank.student, 0, replace(recipe.backend, max_model_len=rank.settings.max_length,
                                                 tensor_parallel_size=1), rank.batch)
    engines = ([(stage.name, policy)] if stage.colocated else []) + \
        [(f"{stage.name} (environment)", engine) for engine in stage.environment]
    for label, engine in engines:
        rows.append(cpu_engine_row(label, engine, model_shape(engine.model), hardware))
        host += rows[-1].per_device
    if stage.index is not None:
        rows += _index_rows(stage, hardware)
        host += stage.index.host + stage.index.encoder
    if len(rows) > 1:
        rows.append(host_row(stage.name, "all of the above, summed", host, hardware))
    return rows


@dataclass(frozen=True)
class GPULoad:
    """What one GPU holds during `maps-train rl`, summed in this order: the GRPO rank and TRL's colocated engine
    (on each training GPU), the environment's engines, the retrieval service's encoder (GPU 0)."""

    where: str
    rank: float
    colocated: float
    environment: float
    encoder: float

    @property
    def total(self) -> float:
        return self.rank + self.colocated + self.environment + self.encoder


def _gpu_rows(stage: RLStage, recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    """The rank and TRL's engine on each training GPU (GPU 0 for one rank), the environment's engines where the
    pool places them; one summed row per GPU that holds any of them."""
    rank, name, context = stage.rank, stage.name, stage.rank.settings.max_length
    capacity = hardware.gpu_memory_gb * GB
    rows = [Row(name, stage.process, "each training GPU", stage.need.total, capacity, stage.note)]
    colocated = stage.colocated_utilization * capacity if stage.colocated else 0.0
    if stage.colocated:
        engine = memory.engine_memory(rank.shape, tensor_parallel=1, max_model_len=context, max_loras=0,
                                      max_lora_rank=recipe.backend.max_lora_rank, budget=colocated)
        problem = None
        if engine.needed > colocated:
            problem = (f"{name}: TRL's colocated engine needs {gb(engine.needed)} (weights, runtime and one "
                       f"{context}-token sequence), {gb(engine.needed - colocated)} over its "
                       f"{gb(colocated)} (rl.grpo.vllm_gpu_memory_utilization {stage.colocated_utilization:g} x "
                       f"{hardware.gpu_memory_gb:g} GB); raise rl.grpo.vllm_gpu_memory_utilization or lower "
                       f"rl.grpo.vllm_max_model_length")
        rows.append(Row(name, f"TRL's colocated vLLM {rank.student} (LoRA merged)", "each training GPU",
                        engine.needed, colocated, f"weights {gb(engine.weights)}, KV {gb(engine.kv_per_sequence)} "
                        f"per {context}-token sequence: {engine.full_sequences} full-length sequences at once",
                        problem))
    rows += _index_rows(stage, hardware)
    environment_on: dict[int, float] = {}  # what the environment's engines take of each GPU
    for spec in stage.environment:
        engine_rows_, taken = engine_rows(f"{name} (environment)", spec, hardware)
        rows += engine_rows_
        for gpu, used in taken.items():
            environment_on[gpu] = environment_on.get(gpu, 0.0) + used
    encoder = stage.index.encoder if stage.index is not None else 0.0
    for gpu in sorted({0, *environment_on}):
        where = "each training GPU" if gpu == 0 and not stage.environment else f"GPU {gpu}"
        load = GPULoad(where, stage.need.total if gpu == 0 else 0.0, colocated if gpu == 0 else 0.0,
                       environment_on.get(gpu, 0.0), encoder if gpu == 0 else 0.0)
        problem = _rl_refusal(name, rank, load, capacity) if load.total > capacity else None
        rows.append(Row(name, "all of the above, summed", where, load.total, capacity, "", problem))
    return rows


def _rl_refusal(stage: str, rank: GRPORank, load: GPULoad, capacity: float) -> str:
    """By how much a GPU is over, and the first change that fits: checkpointing, then fewer rows a device (the same
    rows a step through gradient accumulation), then smaller engines. A GPU without the rank holds environment
    engines only."""
    parts = ([f"the GRPO step at {rank.batch} x {rank.settings.max_length} tokens {gb(load.rank)}"] if load.rank else
             []) + ([f"TRL's colocated engine {gb(load.colocated)}"] if load.colocated else []) + \
        ([f"the environment's engine {gb(load.environment)}"] if load.environment else []) + \
        ([f"the retrieval service's encoder {gb(load.encoder)}"] if load.encoder else [])
    head = (f"{stage}: {load.where} holds {gb(load.total)} ({', '.join(parts)}), {gb(load.total - capacity)} over "
            f"{gb(capacity)}")
    if not load.rank:
        return f"{head}; lower backend.gpu_memory_utilization or serve the environment (rl.environment: server)"
    room = capacity - load.colocated - load.environment - load.encoder
    changes = change_that_fits(lambda rows, kept: rank.memory(rows, kept).total, room, rank.batch,
                               rank.accumulation, rank.settings, "rl.grpo")
    if changes is not None:
        same = " (the same rows a step)" if any("per_device_train_batch_size" in c for c in changes) else ""
        return f"{head}; set {' '.join(changes)}{same}"
    return (f"{head}; even one row with checkpointing does not fit beside the engines: lower "
            f"rl.grpo.vllm_gpu_memory_utilization or rl.grpo.vllm_max_model_length, or serve the environment "
            f"(rl.environment: server)")
