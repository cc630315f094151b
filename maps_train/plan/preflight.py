"""The plan of the one stage a command runs, checked before that command starts any engine or rank.

`maps-train traces`, `train`, `serve`, `eval` and `rl` each declare `--no-plan` and call `preflight` first in
their body, through `maps_train.preflight_hook` (they sit below this package), where `maps_train.cli` installs it. The check uses the hardware the recipe states (`hardware:`, the user's own
statement), so a refusal says how to state another machine or skip the check; where nvidia-smi shows fewer or
smaller GPUs than stated, one warning line says so (`machine_warnings`). A model or corpus whose size is not at
hand (not cached here, not shipped) never blocks: the run may be on a machine that has it, so one warning line and
the command goes on. No torch or vLLM is imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from maps_train.errors import MapsTrainError
from maps_train.plan.engines import agent_stage, serve_rows
from maps_train.plan.grpo import rl_rows
from maps_train.plan.rows import Plan
from maps_train.plan.stages import plan_systems, suite_recipes
from maps_train.plan.training import train_rows

NO_PLAN_ENV = "MAPS_TRAIN_NO_PLAN"  # set to 1: every stage skips the check (as --no-plan does)
STAGES = ("traces", "train", "serve", "eval", "rl")


def load_stage_inputs(stage: str, path: str, overrides: list[str], accelerate_config: str | None = None) -> Any:
    """What `stage` reads, loaded once: the suite and its systems' recipes (eval), else the recipe. Its own errors
    stop the command here, as they would without the check."""
    if stage == "eval":
        return suite_recipes(Path(path), overrides)
    if stage not in STAGES:
        raise MapsTrainError(f"plan: no pre-flight for stage '{stage}' (known: {', '.join(STAGES)})")
    from maps_train.recipe import load_recipe

    recipe = load_recipe(path, overrides)
    if accelerate_config:  # `maps-train train --accelerate-config` wins over the recipe's, as in train/launch.py
        recipe = replace(recipe, train=replace(recipe.train, accelerate_config=accelerate_config))
    return recipe


def plan_of_stage(stage: str, inputs: Any, num_machines: int | None = None) -> Plan:
    """Only the rows of what `stage` starts, from `load_stage_inputs`: the teacher's engines and the index
    (traces), one launch per adapter (train: on each of `num_machines`, else the accelerate config's), the
    student's server (serve), each system's engines and the index (eval), or a GRPO rank with its engines (rl)."""
    if stage == "eval":
        return plan_systems(*inputs)
    recipe = inputs
    rows = {"traces": lambda: agent_stage("traces", [recipe], recipe.hardware),
            "train": lambda: train_rows(recipe, recipe.hardware, num_machines),
            "serve": lambda: serve_rows(recipe, recipe.hardware),
            "rl": lambda: rl_rows(recipe, recipe.hardware)}
    plan = Plan(recipe.name, recipe.hardware)
    plan.rows += rows[stage]()
    return plan


def visible_gpu_memory_gb() -> list[float] | None:
    """The memory of each GPU this process may use (after CUDA_VISIBLE_DEVICES), in 10^9 bytes, as nvidia-smi
    reports it; [] when the machine shows none; None when it cannot tell (no nvidia-smi: maybe a login node)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = {}
    for line in out.splitlines():
        index, _, mib = line.partition(",")
        if index.strip().isdigit() and mib.strip().replace(".", "", 1).isdigit():
            sizes[index.strip()] = float(mib) * 2**20 / 1e9
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(sizes.values())
    chosen = [part.strip() for part in visible.split(",") if part.strip()]
    if all(part.isdigit() for part in chosen):
        return [sizes[part] for part in chosen if part in sizes]
    return list(sizes.values())[: len(chosen)]  # UUIDs or MIG names: as many GPUs as named


def machine_warnings(hardware, measured: list[float] | None = None) -> list[str]:
    """One line when the machine this runs on has fewer or smaller GPUs than `hardware` states (the plan is for the
    stated machine); nothing when it cannot tell. `measured`: `visible_gpu_memory_gb()`, read here by default."""
    measured = visible_gpu_memory_gb() if measured is None else measured
    if measured is None or not hardware.gpus:
        return []
    stated = f"{hardware.gpus} x {hardware.gpu_memory_gb:g} GB"
    smallest = min(measured, default=0.0)
    if len(measured) < hardware.gpus or smallest < hardware.gpu_memory_gb:
        seen = f"{len(measured)} GPU(s)" + (f", the smallest {smallest:.1f} GB" if measured else "")
        return [f"this machine has {seen}, fewer or smaller than the {stated} the plan is for (hardware:); state "
                f"this machine (--gpus, --gpu-memory-gb, or hardware.gpus / hardware.gpu_memory_gb) to plan for it"]
    return []


def _how_to_override(stage: str) -> str:
    where = "the systems' recipes' hardware:" if stage == "eval" else "hardware.gpus=N hardware.gpu_memory_gb=G"
    return f"if this machine differs, state it ({where}) or skip the check with --no-plan ({NO_PLAN_ENV}=1)"


def check_stage(stage: str, path: str, overrides: list[str], *, accelerate_config: str | None = None,
                num_machines: int | None = None, skip: bool = False, warn: Callable[[str], None] = print) -> None:
    """Refuse `stage` (a MapsTrainError) when its plan does not fit the stated hardware, each problem first as
    its own `maps-train: plan refused:` line through `warn`; do nothing when skipped."""
    if skip or os.environ.get(NO_PLAN_ENV, "") not in ("", "0"):
        return
    inputs = load_stage_inputs(stage, path, overrides, accelerate_config)
    try:
        plan = plan_of_stage(stage, inputs, num_machines)
    except MapsTrainError as err:  # sizes not at hand here (model, corpus): the command may still run
        warn(f"maps-train: warning: {stage}: not planned ({err}); going on")
        return
    for line in machine_warnings(plan.hardware):
        warn(f"maps-train: warning: {stage}: {line}")
    if not plan.problems:
        return
    for problem in plan.problems:
        warn(f"maps-train: plan refused: {problem}")
    hw = plan.hardware
    machine = f"{hw.gpus} x {hw.gpu_memory_gb:g} GB GPU" if hw.gpus else f"CPUs only, {hw.memory_gb:g} GB host"
    raise MapsTrainError(f"{stage}: refused before anything started: {len(plan.problems)} problem(s) on the stated "
                         f"hardware ({machine}); {_how_to_override(stage)}")


def preflight(stage: str, path: str, overrides: list[str] | None, *, skip: bool,
              accelerate_config: str | None = None, num_machines: int | None = None) -> None:
    """`check_stage` for the command of `stage`: its warnings and refusals as lines on stderr."""
    check_stage(stage, path, overrides or [], accelerate_config=accelerate_config, num_machines=num_machines,
                skip=skip, warn=lambda line: typer.echo(line, err=True))
