"""Everything a study needs, checked before its first stage (`plan_study`), and its dev questions checked against
what was trained on before its eval (`check_dev_untrained`).

Before any work, one line and exit 2 for: a recipe or suite that does not load (a misspelt key, an override naming
no field), `--dev`/`--train` sizes the sources cannot give, a recipe whose traces do not read this study's split, a
data set file that is missing or empty (the dev files the split writes excepted), a `--base`/`--baseline` the suite
does not hold, and a stage folder made with other settings (`stamps.check_stages`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.evaluate.datasets import dataset_info
from maps_train.evaluate.suite import SuiteConfig, SystemSpec, load_suite, load_suite_questions, resolve_recipe_path
from maps_train.recipe import Recipe, load_recipe
from maps_train.records.shards import TRACES_FILE
from maps_train.study.keys import same_file, study_stages
from maps_train.study.split import draw_split
from maps_train.study.stamps import Stage, check_stages


@dataclass
class StudyPlan:
    recipe: Recipe
    suite: SuiteConfig
    stages: list[Stage]
    to_remove: list[Stage]  # stamped folders --rebuild-from removes
    systems: list[str]  # the suite's systems the eval runs, in the suite's order
    dropped: list[str] = field(default_factory=list)  # systems that need the RL stage, which this study does not run
    rl_systems: list[str] = field(default_factory=list)

    def stage(self, name: str) -> Stage:
        return next(stage for stage in self.stages if stage.name == name)


def _under(path: str | Path, folder: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def rl_systems(suite: SuiteConfig, recipe: Recipe) -> list[str]:
    """The suite's systems that serve an adapter from the RL stage's folder (rl.output_dir)."""
    return [spec.name for spec in suite.systems
            if any(_under(path, recipe.rl.output_dir) for path in spec.adapters.values())]


def _check_file(path: Path, where: str) -> None:
    if not path.is_file():
        raise MapsTrainError(f"{where}: {path}: no such file")
    if path.stat().st_size == 0:
        raise MapsTrainError(f"{where}: {path}: empty file")


def _check_datasets(suite: SuiteConfig, suite_path: str, split_dev: Path, split_names: set[str]) -> None:
    for index, spec in enumerate(suite.datasets):
        where = f"{suite_path}: datasets[{index}] ({spec.name})"
        if spec.path is None:
            info = dataset_info(spec.name)
            if spec.hub is not None:
                continue  # downloaded by the eval (online only)
            if info is None:
                raise MapsTrainError(f"{where}: not a known data set; give `path:`")
            _check_file(info.default_path(spec.name, suite.data_root), where)
        elif _under(spec.path, split_dev):
            if not (same_file(spec.path, split_dev / f"{Path(spec.path).stem}.jsonl")
                    and Path(spec.path).stem in split_names):
                raise MapsTrainError(f"{where}: {spec.path} is in the split's dev folder, but the split writes only "
                                     f"{', '.join(sorted(split_names))} there")
        else:
            _check_file(Path(spec.path), where)


def _check_recipe_reads_split(recipe: Recipe, recipe_path: str, split_train: Path) -> None:
    if not any(same_file(path, split_train) for path in recipe.traces.questions):
        raise MapsTrainError(f"{recipe_path}: traces.questions reads {', '.join(recipe.traces.questions)}, not this "
                             f"study's split ({split_train}); use the --out the recipe names, or point the recipe "
                             f"at the split")
    for path in recipe.traces.questions:
        if not same_file(path, split_train):
            _check_file(Path(path), f"{recipe_path}: traces.questions")


def plan_study(recipe_path: str, suite_path: str, suite_overrides: list[str], *, data_root: str, out: Path,
               dev: int, train: int, seed: int, rl: bool, base: str, baseline: str,
               rebuild_from: str | None) -> StudyPlan:
    """Check everything (module docstring); returns the plan. Writes nothing."""
    recipe = load_recipe(recipe_path)
    suite = load_suite(suite_path, suite_overrides)
    record, _, _ = draw_split(data_root, dev=dev, train=train, seed=seed)
    split_dir = out / "split"
    _check_recipe_reads_split(recipe, recipe_path, split_dir / "train.jsonl")
    _check_datasets(suite, suite_path, split_dir / "dev", set(record["dev"]))
    names = [spec.name for spec in suite.systems]
    for flag, name in (("--base", base), ("--baseline", baseline)):
        if name not in names:
            raise MapsTrainError(f"{flag} {name}: no such system in {suite_path} (there: {', '.join(names)})")
    for index, spec in enumerate(suite.systems):
        resolve_recipe_path(spec.recipe, Path(suite_path), f"systems[{index}].recipe")
    needs_rl = rl_systems(suite, recipe)
    dropped = [] if rl else needs_rl
    systems = [name for name in names if name not in dropped]
    evaluated = [_system_key(spec) for spec in suite.systems if spec.name in systems]
    stages = study_stages(recipe, out=out, data_root=data_root, dev=dev, train=train, seed=seed, rl=rl,
                          eval_dir=Path(suite.out_dir), eval_systems=evaluated)
    to_remove = check_stages(stages, rebuild_from)
    return StudyPlan(recipe, suite, stages, to_remove, systems, dropped, needs_rl)


def _system_key(spec: SystemSpec) -> dict[str, Any]:
    spec_dict = asdict(spec)
    spec_dict.pop("note", None)  # printed under a table; changes no answer
    return spec_dict


def _training_questions(recipe: Recipe) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """(dataset, id) pairs and normalised question texts -> where they were trained on: every trace of the traces
    folder, every questions file of traces and rl."""
    ids: set[tuple[str, str]] = set()
    texts: dict[str, str] = {}
    root = Path(recipe.traces.out_dir)
    files = sorted(root.rglob(TRACES_FILE)) if root.is_dir() else []
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line: sft-data skips it too
                if isinstance(row, dict) and isinstance(row.get("question"), str):
                    ids.add((str(row.get("dataset")), str(row.get("question_id"))))
                    texts.setdefault(row["question"].strip().lower(), str(path))
    for path in [*recipe.traces.questions, *recipe.rl.questions]:
        if Path(path).is_file():
            for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("question"), str):
                    ids.add((str(row.get("dataset")), str(row.get("id"))))
                    texts.setdefault(row["question"].strip().lower(), str(path))
    return ids, texts


def check_dev_untrained(suite: SuiteConfig, suite_path: str, recipe: Recipe) -> int:
    """A one-line error when a question the eval would score was trained on (its text, or its data set and id, in
    the traces or the training questions); returns the number of dev questions checked."""
    ids, texts = _training_questions(recipe)
    questions = load_suite_questions(suite, suite.datasets, Path(suite_path))
    checked = 0
    for dataset, items in questions.items():
        for question in items:
            checked += 1
            found = texts.get(question.question.strip().lower())
            if found is None and (dataset, question.id) in ids:
                found = "the training questions"
            if found is not None:
                raise MapsTrainError(f"{suite_path}: dev question {dataset}/{question.id} was trained on (in "
                                     f"{found}); the study scores only questions it never trained on")
    return checked


__all__ = ["StudyPlan", "check_dev_untrained", "plan_study", "rl_systems"]
