"""`maps-train train`: one `accelerate launch` per adapter, one rank per GPU; and what sizes any LoRA training
rank's step (`StepSettings`), shared with the GRPO rank of `maps-train rl`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.library_options import LoraOptions, SFTOptions
from maps_train.plan import memory
from maps_train.plan.memory import GB
from maps_train.plan.rows import Row, gb, gpu_range, host_row
from maps_train.plan.shapes import ModelShape, model_shape
from maps_train.recipe import HardwareConfig, Recipe, adapter_names


@dataclass(frozen=True)
class StepSettings:
    """What sizes one training rank's step besides its batch (`memory.train_memory`'s settings), read from the
    recipe's library options as the trainer resolves them (`library_options`)."""

    max_length: int
    lora_rank: int
    lora_dropout: float
    checkpointing: bool
    bf16: bool
    world: int
    zero_stage: int
    on_gpu: bool

    def memory(self, shape: ModelShape, batch: int, scored: int | None = None) -> memory.TrainMemory:
        return memory.train_memory(shape, batch=batch, scored=scored, **dataclasses.asdict(self))

    def checkpointing_note(self) -> str:
        return f"checkpointing {'on' if self.checkpointing else 'off'}"


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
    settings = StepSettings(max_length=int(sft.max_length), lora_rank=int(lora.r),
                            lora_dropout=float(lora.lora_dropout), checkpointing=bool(sft.gradient_checkpointing),
                            bf16=on_gpu and bool(sft.bf16), world=world * machines, zero_stage=zero, on_gpu=on_gpu)
    batch = int(sft.per_device_train_batch_size)
    need = settings.memory(shape, batch)
    stage = f"train {', '.join(adapter_names(recipe))}"
    process = (f"{world} x rank {recipe.train.student} LoRA r{settings.lora_rank}" + (f" ZeRO-{zero}" if zero else "")
               + (f", each of {machines} machines" if machines > 1 else ""))
    note = (f"weights {gb(need.weights)}, activations {gb(need.activations)} ({batch} x {settings.max_length} "
            f"tokens, {settings.checkpointing_note()}), fused LM head {gb(need.lm_head)}")
    if not on_gpu:
        return [host_row(stage, process, world * need.total, hardware, note)]
    budget = hardware.gpu_memory_gb * GB
    problem = _train_refusal(stage, recipe, shape, need, budget, batch, settings) if need.total > budget else None
    rows = [Row(stage, process, gpu_range(0, min(world, hardware.gpus)), need.total, budget, note, problem)]
    if world > hardware.gpus:
        rows.append(Row(stage, f"accelerate: {world} ranks", gpu_range(0, hardware.gpus), 0, 0, said,
                        f"{stage}: {said} starts {world} ranks, one a GPU, on a machine whose hardware has "
                        f"{hardware.gpus}; set num_processes: {hardware.gpus * machines} there or run on machines of "
                        f"{world} GPUs"))
    return rows


def _train_refusal(stage: str, recipe: Recipe, shape: ModelShape, need: memory.TrainMemory, budget: float,
                   batch: int, settings: StepSettings) -> str:
    """What does not fit, by how much, and the change that makes it fit (checkpointing, then a smaller batch)."""
    accumulation = SFTOptions.of(recipe.train.sft).gradient_accumulation_steps
    head = (f"{stage}: {recipe.train.student} at batch {batch} x {settings.max_length} tokens needs "
            f"{gb(need.total)} a GPU, {gb(need.total - budget)} over {gb(budget)} (activations "
            f"{gb(need.activations)}, fused LM head {gb(need.lm_head)})")
    changes = change_that_fits(lambda rows, kept: kept.memory(shape, rows).total, budget, batch, accumulation,
                               settings, "train.sft")
    if changes is not None:
        same = " (the same effective batch)" if any("per_device_train_batch_size" in c for c in changes) else ""
        return f"{head}; set {' '.join(changes)}{same}"
    return (f"{head}; even batch 1 with checkpointing does not fit: use ZeRO-3 (recipes/accelerate/zero3.yaml) "
            f"or a shorter train.sft.max_length")


def change_that_fits(need_of: Callable[[int, StepSettings], float], budget: float, batch: int, accumulation: int,
                     settings: StepSettings, section: str) -> list[str] | None:
    """The first overrides of `section` (train.sft, rl.grpo) under which `need_of(rows, settings)` fits `budget`:
    checkpointing on, then the largest divisor of the batch with the accumulation raised to match (the rows an
    optimizer step sees stay the same); None when even one row does not fit."""
    checkpointed = dataclasses.replace(settings, checkpointing=True)
    for smaller in (b for b in range(batch, 0, -1) if batch % b == 0):
        if need_of(smaller, checkpointed) <= budget:
            changes = [] if settings.checkpointing else [f"{section}.gradient_checkpointing=true"]
            if smaller != batch:
                changes += [f"{section}.per_device_train_batch_size={smaller}",
                            f"{section}.gradient_accumulation_steps={accumulation * batch // smaller}"]
            return changes
    return None
