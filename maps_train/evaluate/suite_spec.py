"""A suite file (`eval/suites/*.yaml`) as typed specs: data sets, systems (the suite's `defaults:` applied), and each
system's recipe resolved with the routes it asks for (`routes:`, `adapters:`: from the recipe's adapter set,
`maps_train.adapters`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from maps_train.config.names import check_plain_name
from maps_train.config.overlays import load_config
from maps_train.errors import ConfigError
from maps_train.records.hints import refuse_hint
from maps_train.tracking import WandbConfig


@dataclass
class DatasetSpec:
    name: str  # a registry name (nq, popqa, 2wikimultihopqa, hotpotqa, musique, gpqa) or your own with `path`
    path: str | None = None  # a local FlashRAG JSONL (or GPQA CSV); default <data_root>/<name>/<split>.jsonl
    hub: str | None = None  # e.g. RUC-NLPIR/FlashRAG_datasets (online only)
    config: str | None = None  # hub config; the registry's (or `name`) when null
    split: str | None = None  # the registry's when null
    sample: int | None = None  # questions drawn at random; all when null
    seed: int = 0  # sampling seed, and GPQA's option-shuffle seed
    label: str | None = None  # column title; the registry's when null


@dataclass
class SystemDefaults:
    """What every system of a suite shares, stated once (`defaults:`): a system's own fields come after these."""

    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)  # before each system's own overrides (which win)
    params_billion: float | None = None


@dataclass
class SystemSpec:
    name: str
    recipe: str = ""  # a recipe YAML, relative to the working directory (else to the suite file); "": defaults.recipe
    overrides: list[str] = field(default_factory=list)  # dotted recipe overrides, e.g. agent.method=vanilla
    params_billion: float | None = None  # model size for the compute estimate; counted from the model when null
    # Which routes the roles take: the recipe's own (in a distillation recipe, the teacher); `distilled`: the
    # student base with one LoRA adapter per role on an offline vLLM engine; `distilled_server`: the same through a
    # running `maps-train serve` (backend.base_urls); `student_base`: every role on the student base, no adapters.
    routes: Literal["recipe", "distilled", "distilled_server", "student_base"] = "recipe"
    # With routes `distilled`: adapter name -> the folder that replaces its distilled one, e.g. a stage trained
    # after SFT ({writer: runs/x/rl/adapters/writer}); the other adapters stay the distilled ones.
    adapters: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # printed under the report's Cover-EM table (e.g. "prompted protocol, not RL-trained")
    # A reference recipe (the paper's): every answer-deciding setting where this system differs from it, run with
    # this system's method, is listed in `departures` when the suite runs and printed under the Cover-EM table.
    departs_from: str | None = None
    departures: list[str] = field(default_factory=list)  # written by run_suite from departs_from, not by hand


@dataclass
class SuiteConfig:
    name: str = "suite"
    out_dir: str = "runs/eval"
    data_root: str = "data"  # default local layout <data_root>/<name>/<split>.jsonl (FlashRAG's)
    datasets: list[DatasetSpec] = field(default_factory=list)
    defaults: SystemDefaults = field(default_factory=SystemDefaults)  # shared by every system
    systems: list[SystemSpec] = field(default_factory=list)
    wandb: WandbConfig = field(default_factory=lambda: WandbConfig(project="maps-train-eval"))
    # Answer normalisation for Cover-EM/EM/F1: FlashRAG's `normalize_answer` (the paper's protocol), or "unicode"
    # (also Unicode punctuation and NFC; see maps_train/records/metrics.py).
    normalizer: Literal["flashrag", "unicode"] = "flashrag"
    # (system, data set) runs in flight at once. Above 1, runs on the same engines overlap (an in-process vLLM
    # engine or a `vllm serve` fleet batches every run's calls together), so small runs no longer leave the engine
    # idle; runs on other engines wait for the next wave (two engines on the same cores slow each other down far
    # more than they gain). Each run is scored the moment it is done. 1: one run after another.
    parallel_runs: int = 1


def load_suite(path: str | Path, overrides: Sequence[str] = ()) -> SuiteConfig:
    suite = load_config(SuiteConfig, path, overrides)
    check_plain_name(suite.name, f"{path}: name")  # names become folders and W&B runs: never a path
    for kind, specs in (("datasets", suite.datasets), ("systems", suite.systems)):
        if not specs:
            raise ConfigError(f"{path}: {kind}: the suite lists none")
        names = [s.name for s in specs]
        for index, name in enumerate(names):
            check_plain_name(name, f"{path}: {kind}[{index}].name")
            if names.index(name) != index:
                raise ConfigError(f"{path}: {kind}[{index}].name: '{name}' appears twice")
    return with_defaults(suite, path)


def with_defaults(suite: SuiteConfig, path: str | Path) -> SuiteConfig:
    """Each system with the suite's `defaults:` under its own fields: the default recipe where it names none, the
    default overrides before its own (so its own win), the default model size where it gives none."""
    defaults = suite.defaults
    for index, system in enumerate(suite.systems):
        system.recipe = system.recipe or defaults.recipe or ""
        if not system.recipe:
            raise ConfigError(f"{path}: systems[{index}].recipe: missing (and the suite's defaults name none)")
        system.overrides = [*defaults.overrides, *system.overrides]
        if system.params_billion is None:
            system.params_billion = defaults.params_billion
    suite.defaults = SystemDefaults()  # applied: a suite dumped or reloaded from here does not apply it twice
    return suite


def resolve_recipe_path(recipe: str, suite_path: Path, where: str) -> Path:
    for candidate in (Path(recipe), suite_path.parent / recipe):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{suite_path}: {where}: recipe '{recipe}' not found (relative to the working directory or the suite)")


def apply_routes(recipe: Any, routes: str, adapters: dict[str, str] | None = None) -> Any:
    """The recipe with the role routes a system asks for (see `SystemSpec.routes` and `SystemSpec.adapters`)."""
    if adapters and routes != "distilled":
        raise ConfigError(f"adapters: replaces distilled adapter folders, so only with routes: distilled (not {routes})")
    if routes == "recipe":
        return recipe
    if routes in ("distilled", "distilled_server"):
        from maps_train.adapters import distilled_set, with_student_routes

        adapter_set = distilled_set(recipe)
        unknown = sorted(set(adapters or {}) - set(adapter_set.adapters))
        if unknown:
            raise ConfigError(f"adapters: {', '.join(unknown)}: not an adapter of the recipe "
                              f"(its adapters: {', '.join(sorted(adapter_set.adapters))})")
        return with_student_routes(recipe, adapter_set.swapped(adapters or {}),
                                   via="engine" if routes == "distilled" else "server")
    template = recipe.route("default")
    student = dataclasses.replace(
        template,
        model=recipe.serve.base_model or recipe.train.student,
        adapter=None,
        enable_thinking=recipe.sft_data.enable_thinking,
    )
    return dataclasses.replace(recipe, roles={"default": student})


def system_departures(spec: SystemSpec, index: int, suite_path: Path) -> list[str]:
    """Where the system's resolved recipe departs from `spec.departs_from` (see `evaluate.departures`)."""
    from maps_train.evaluate.departures import departures
    from maps_train.recipe import load_recipe

    path = resolve_recipe_path(spec.recipe, suite_path, f"systems[{index}].recipe")
    mine = apply_routes(load_recipe(str(path), spec.overrides), spec.routes, spec.adapters)
    reference = resolve_recipe_path(spec.departs_from, suite_path, f"systems[{index}].departs_from")
    return departures(mine, load_recipe(str(reference), [f"agent.method={mine.agent.method}"]))


def load_system_recipe(spec: SystemSpec, index: int, suite_path: Path) -> Any:
    from maps_train.recipe import load_recipe

    path = resolve_recipe_path(spec.recipe, suite_path, f"systems[{index}].recipe")
    recipe = apply_routes(load_recipe(str(path), spec.overrides), spec.routes, spec.adapters)
    refuse_hint(recipe.agent.hint, f"{suite_path}: systems[{index}] ({spec.name}): ", "an evaluation must not use it")
    if spec.routes == "distilled":  # fail now, not when the engine loads the first adapter an hour in
        for role, route in recipe.roles.items():
            if route.adapter and not Path(route.adapter).is_dir():
                raise ConfigError(
                    f"{suite_path}: systems[{index}] ({spec.name}): adapter of role '{role}' not found at "
                    f"{route.adapter} (train it first: maps-train train {spec.recipe})"
                )
    return recipe
