"""Which adapter set a recipe's stages read, and the student's routes from a set.

The one place that turns a recipe's folders into adapter sets: the distilled set (`serve.adapters_dir`, else
`train.output_dir`: what `serve` serves and eval's `routes: distilled` runs) and RL's starting set
(`rl.adapters_dir`, else the distilled set: RL's policy AND its environment start from this one set).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from maps_train.adapters.set import AdapterSet
from maps_train.recipe import Recipe, RoleRoute, adapter_of_role


def distilled_dir(recipe: Recipe) -> Path:
    """The distilled adapters: `serve.adapters_dir`, else where `train` wrote them (`train.output_dir`)."""
    return Path(recipe.serve.adapters_dir or recipe.train.output_dir)


def rl_source_dir(recipe: Recipe) -> Path:
    """The adapters RL starts from and plays against: `rl.adapters_dir`, else the distilled adapters."""
    return Path(recipe.rl.adapters_dir) if recipe.rl.adapters_dir else distilled_dir(recipe)


def load_set(path: str | Path, recipe: Recipe) -> AdapterSet:
    """The adapter set at `path` (its manifest; a folder without one is read with the recipe's role mapping)."""
    return AdapterSet.load(path, adapter_of_role(recipe))


def distilled_set(recipe: Recipe) -> AdapterSet:
    return load_set(distilled_dir(recipe), recipe)


def rl_source_set(recipe: Recipe) -> AdapterSet:
    return load_set(rl_source_dir(recipe), recipe)


def student_base(recipe: Recipe) -> str:
    """The student base the adapters were trained on, as the recipe names it."""
    return recipe.serve.base_model or recipe.train.student


def student_routes(recipe: Recipe, adapters: AdapterSet, via: str = "engine",
                   base: str | None = None) -> dict[str, RoleRoute]:
    """Role -> route of the student with `adapters` (see `AdapterSet.routes`), sampled as the recipe's default
    route, thinking as its SFT rows were rendered."""
    template = recipe.route("default") if "default" in recipe.roles else RoleRoute()
    return adapters.routes(template, base or student_base(recipe), recipe.sft_data.enable_thinking, via)


def with_student_routes(recipe: Recipe, adapters: AdapterSet, via: str = "engine") -> Recipe:
    """A copy of `recipe` whose roles are the student's with `adapters` (the teacher's routes replaced), its
    engines at the student's tensor parallelism (`serve.tensor_parallel_size`), not the teacher's."""
    backend = dataclasses.replace(recipe.backend, tensor_parallel_size=recipe.serve.tensor_parallel_size)
    return dataclasses.replace(recipe, roles=student_routes(recipe, adapters, via), backend=backend)
