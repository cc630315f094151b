"""Where a system's recipe departs from a reference recipe (the paper's), in the settings that decide its answers.

A suite system may name `departs_from: RECIPE` (the distillation teacher names recipes/paper/qwen3-32b.yaml): the
suite compares the two resolved recipes, the reference run with the system's own method, and the report prints
every difference under its Cover-EM table. So a row read as "the teacher" says where it is not the paper's MAPS
(thinking, budgets, context) instead of leaving the reader to diff YAML files.

Compared: the agent's settings (not `batch_size`, `schedule`, `concurrency`: they set speed, not answers), the
route of every role the method calls (not the transport `backend`), the backend's context and reasoning-cap
settings, and the retrieval settings that decide which passages come back (not where the index lies).
"""

from __future__ import annotations

from typing import Any

from maps_train.agents.registry import method_roles
from maps_train.config.yaml_io import to_dict

SPEED_ONLY = ("batch_size", "schedule", "concurrency")
BACKEND_SETTINGS = ("max_model_len", "truncate_prompt", "reasoning_cap", "reasoning_cap_answer_tokens")
RETRIEVAL_SETTINGS = ("corpus", "kind", "encoder", "index_type", "query_prefix", "passage_prefix")


def _flat(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}.{key}"))
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


def compared_settings(recipe: Any) -> dict[str, Any]:
    """Dotted setting -> value, for every setting that decides what the recipe's method answers."""
    agent = {k: v for k, v in to_dict(recipe.agent).items() if k not in SPEED_ONLY}
    settings = _flat(agent, "agent")
    for role in method_roles(recipe.agent.method):
        route = to_dict(recipe.route(role))
        route.pop("backend")
        settings.update(_flat(route, f"roles.{role}"))
    settings.update({f"backend.{k}": getattr(recipe.backend, k) for k in BACKEND_SETTINGS})
    settings.update({f"retrieval.{k}": getattr(recipe.retrieval, k) for k in RETRIEVAL_SETTINGS})
    return settings


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    return str(value)


def departures(recipe: Any, reference: Any) -> list[str]:
    """`setting value (reference: value)` for each compared setting where `recipe` differs from `reference`."""
    mine, theirs = compared_settings(recipe), compared_settings(reference)
    keys = list(dict.fromkeys([*mine, *theirs]))
    return [f"{key} {_shown(mine.get(key))} (reference: {_shown(theirs.get(key))})"
            for key in keys if mine.get(key) != theirs.get(key)]


__all__ = ["compared_settings", "departures"]
