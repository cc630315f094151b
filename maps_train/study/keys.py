"""Each stage of a study with its folder and its key: the settings and inputs that stage reads (`stamps.Stage`).

    split     --dev, --train, --seed and the hash of every source file the split reads
    traces    the split's digest, the hash of any other questions file, recipe retrieval/backend/roles/agent/traces
    sft-data  the traces' digest, recipe sft_data and what of train decides the rows (student, sft.max_length)
    train     the SFT sets' digest, recipe train
    rl        the adapters' digest, recipe rl and what the RL environment runs (retrieval/backend/roles/agent)
    eval      the adapters' (and RL adapters') digest, the evaluated systems as the suite defines them

Secrets (an API key, a URL's password) are redacted before they enter a key, so no stamp holds one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from maps_train.config.redaction import redact_secrets
from maps_train.recipe import Recipe, sft_set_dir
from maps_train.study.split import SOURCES, SplitSource
from maps_train.study.stamps import Stage, file_digest


def _section(recipe: Recipe, name: str) -> Any:
    value = getattr(recipe, name)
    if isinstance(value, dict):
        value = {key: dataclasses.asdict(item) if dataclasses.is_dataclass(item) else item
                 for key, item in value.items()}
    else:
        value = dataclasses.asdict(value)
    return redact_secrets(value)


def recipe_sections(recipe: Recipe, *names: str) -> dict[str, Any]:
    return {f"recipe.{name}": _section(recipe, name) for name in names}


def same_file(a: str | Path, b: str | Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def split_key(data_root: str | Path, *, dev: int, train: int, seed: int,
              sources: tuple[SplitSource, ...] = SOURCES) -> dict[str, Any]:
    files = {}
    for source in sources:
        for name in {source.dev_file, source.train_file or source.dev_file}:
            path = Path(data_root) / name
            files[name] = file_digest(path) if path.is_file() else "(missing)"
    return {"--dev": dev, "--train": train, "--seed": seed, "sources": files}


def study_stages(recipe: Recipe, *, out: Path, data_root: str | Path, dev: int, train: int, seed: int, rl: bool,
                 eval_dir: Path, eval_systems: list[dict[str, Any]]) -> list[Stage]:
    """The stages this study runs, in order, each keyed (see the module docstring)."""
    split = Stage("split", out / "split", split_key(data_root, dev=dev, train=train, seed=seed))
    split_train = out / "split" / "train.jsonl"
    questions = {path: ("(the split's)" if same_file(path, split_train) else
                        file_digest(path) if Path(path).is_file() else "(missing)")
                 for path in recipe.traces.questions}
    traces = Stage("traces", Path(recipe.traces.out_dir), {
        "split": split.digest, "questions": questions,
        **recipe_sections(recipe, "retrieval", "backend", "roles", "agent", "traces")})
    sft = Stage("sft-data", sft_set_dir(recipe), {
        "traces": traces.digest, **recipe_sections(recipe, "sft_data"),
        "recipe.train.student": recipe.train.student, "recipe.train.sft.max_length": recipe.train.sft.get("max_length")})
    adapters = Stage("train", Path(recipe.train.output_dir), {"sft-data": sft.digest, **recipe_sections(recipe, "train")})
    stages = [split, traces, sft, adapters]
    if rl:
        rl_questions = {path: file_digest(path) if Path(path).is_file() else "(missing)"
                        for path in recipe.rl.questions if not same_file(path, split_train)}
        stages.append(Stage("rl", Path(recipe.rl.output_dir), {
            "train": adapters.digest, "questions": rl_questions,
            **recipe_sections(recipe, "rl", "retrieval", "backend", "roles", "agent")}))
    stages.append(Stage("eval", eval_dir, {"adapters": [stage.digest for stage in stages[3:]],
                                           "systems": redact_secrets(eval_systems)}))
    return stages


__all__ = ["recipe_sections", "same_file", "split_key", "study_stages"]
