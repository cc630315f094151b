"""Shared fixtures: offline builtins materialised once per session, paths to the real data.

Environment: tests run offline (HF_HUB_OFFLINE=1) against builtin models cached under MAPS_TRAIN_HOME
(default: <repo>/.cache/maps-train, so repeated runs reuse the converted SmolLM2).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maps_train.platform import apply_runtime_defaults

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
apply_runtime_defaults(offline=True)

pytest_plugins = ["fixtures_llm"]  # LLM backend fixtures (tests/ is on sys.path: rootdir conftest, no __init__)

REALDATA = REPO.parent / "shared" / "realdata"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def realdata() -> Path:
    if not (REALDATA / "corpus" / "corpus.jsonl").exists():
        pytest.skip("../shared/realdata is not beside the checkout")
    return REALDATA


@pytest.fixture(scope="session")
def tiny_qwen3() -> str:
    """Folder of the builtin tiny Qwen3 (random weights, 2k BPE vocabulary, Qwen3 chat template)."""
    from maps_train.models import resolve_model

    return resolve_model("builtin:tiny-qwen3")


@pytest.fixture(scope="session")
def minilm() -> str:
    from maps_train.models import resolve_model

    return resolve_model("builtin:minilm-l6")


@pytest.fixture(scope="session")
def smollm2() -> str:
    from maps_train.models import resolve_model

    return resolve_model("builtin:smollm2-135m-instruct")


@pytest.fixture(params=["step", "continuous"])
def schedule(request) -> str:
    """Both ways a run advances its questions (maps_train/agents/schedule.py): method tests pass in each."""
    return request.param
