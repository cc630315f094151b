"""Each stage a recipe or suite runs, its processes laid onto the hardware the recipe names.

A recipe runs: the index (built once, then searched in process by every agent run: `index`), the teacher's
traces (its routes' engines: `engines`), training (one `accelerate launch` per adapter, one rank per GPU:
`training`), serving (`vllm serve` of the student with its adapters: `engines.serve_rows`) and RL (`grpo`). A suite
runs the index and each system's engines; the suite's engine pool closes a finished system's engines before one
that would not fit beside them starts (maps_train/llm/pool.py), so each system's engines are counted on their own.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.plan.engines import agent_stage, engines_of_recipe, serve_rows
from maps_train.plan.grpo import rl_rows
from maps_train.plan.index import index_rows
from maps_train.plan.rows import Plan, Row
from maps_train.plan.training import train_rows
from maps_train.recipe import HardwareConfig, Recipe
from maps_train.retrieval.factory import retriever_key


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
        recipes.append(apply_routes(load_recipe(str(recipe_path), spec.overrides), spec.routes, spec.adapters))
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
        key = " ".join(engine.key for engine in engines_of_recipe(recipe))
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
