"""Issue 44: the plan's RL environment is the one `maps-train rl` builds, from rl's own functions
(`environment_recipe`, `policy_router`): the trained role's calls go to the policy, so an engine only the trained
role's route names is never started, and never planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from maps_train.plan.stages import make_plan

REPO = Path(__file__).resolve().parents[1]
RL_4B = "recipes/distill/qwen3-4b.yaml"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name their accelerate configs and data relative to the repository


def _environment(overrides: list[str]) -> list[str]:
    return [row.process for row in make_plan(RL_4B, overrides).rows if row.stage == "rl consolidator (environment)"]


def test_an_engine_only_the_trained_role_routes_to_is_not_planned():
    """rl.environment recipe: the consolidator (and its "answer" calls) on an 8B engine of their own, the other
    roles on the teacher's 32B engine. RL trains the consolidator: its calls go to the policy, the 8B engine never
    starts; the teacher's does."""
    own = "roles.consolidator={backend: vllm, model: Qwen/Qwen3-8B}"
    assert _environment(["rl.environment=recipe", own, "roles.answer={backend: vllm, model: Qwen/Qwen3-8B}"]) == \
        ["vLLM Qwen/Qwen3-32B (tp 4)"]
    # another role on the 8B engine keeps it in the environment
    assert _environment(["rl.environment=recipe", own, "roles.writer={backend: vllm, model: Qwen/Qwen3-8B}"]) == \
        ["vLLM Qwen/Qwen3-32B (tp 4)", "vLLM Qwen/Qwen3-8B (tp 4)"]


def test_a_served_environment_starts_no_engine_here():
    assert _environment(["rl.environment=server"]) == []
