"""Shared fixtures: offline builtins materialised once per session, paths to the real data.

Environment: tests run offline (HF_HUB_OFFLINE=1) against builtin models cached under MAPS_TRAIN_HOME
(default: <repo>/.cache/maps-train, so repeated runs reuse the converted SmolLM2).

Real data (`realdata`): ../shared/realdata beside the checkout (MAPS_TRAIN_REALDATA names another folder). Where a
file the tests read is missing, its tests skip and the summary says how many; with MAPS_TRAIN_REQUIRE_REALDATA=1
(set by .ci/run) they fail instead, so CI cannot pass without them.

Hypothesis: failures are saved under <repo>/.hypothesis (git-ignored) and replayed first on the next run, and each
failure prints the blob that reproduces it (`@reproduce_failure`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from maps_train.platform import apply_runtime_defaults

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
apply_runtime_defaults(offline=True)

# LLM backends and the retrieval indexes, one per session (tests/ is on sys.path: rootdir conftest, no __init__)
pytest_plugins = ["fixtures_llm", "fixtures_retrieval"]

REALDATA = Path(os.environ.get("MAPS_TRAIN_REALDATA") or REPO.parent / "shared" / "realdata")
# Every file of the real data a test reads: one missing skips (or, required, fails) every test that asks for it.
REALDATA_FILES = (
    "corpus/corpus.jsonl",
    "hotpotqa/dev.jsonl",
    "2wikimultihopqa/dev.jsonl",
    "2wikimultihopqa/train_sample.jsonl",
    "musique/dev.jsonl",
    "popqa/test.jsonl",
    "nq/test.jsonl",
)
REALDATA_SKIP = "real data missing"  # starts every such skip's reason; the summary counts them by it

settings.register_profile(
    "maps-train",
    database=DirectoryBasedExampleDatabase(REPO / ".hypothesis" / "examples"),
    print_blob=True,
)
settings.load_profile("maps-train")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def realdata() -> Path:
    missing = [name for name in REALDATA_FILES if not (REALDATA / name).is_file()]
    if missing:
        reason = f"{REALDATA_SKIP}: {REALDATA} lacks {', '.join(missing)}"
        if os.environ.get("MAPS_TRAIN_REQUIRE_REALDATA") == "1":
            pytest.fail(f"{reason} (MAPS_TRAIN_REQUIRE_REALDATA=1)", pytrace=False)
        pytest.skip(reason)
    return REALDATA


def pytest_terminal_summary(terminalreporter) -> None:
    """Say in one line how many tests the missing real data skipped: `-ra` lists them, easy to miss among others."""
    skipped = [
        report for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and REALDATA_SKIP in str(report.longrepr[2])
    ]
    if skipped:
        terminalreporter.write_line(
            f"maps-train: {len(skipped)} tests skipped: {REALDATA_SKIP} at {REALDATA} "
            "(MAPS_TRAIN_REQUIRE_REALDATA=1 makes them fail, as CI does)",
            yellow=True,
            bold=True,
        )


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
