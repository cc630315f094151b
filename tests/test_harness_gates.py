"""What tests/conftest.py promises about the test run itself.

The real-data gate: where a file of ../shared/realdata is missing, its tests skip and the summary counts them in
one line; with MAPS_TRAIN_REQUIRE_REALDATA=1 (as .ci/run sets) they fail instead. Each case runs pytest in a
subprocess on one cheap test that reads real data, with MAPS_TRAIN_REALDATA pointing at a copy of the real-data
layout that lacks one file (partial absence, the case a whole-folder check would miss).

The Hypothesis profile: failures saved and replayed, their blobs printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REALDATA_FILES, REPO

# Reads the first line of four data sets (not the corpus): cheap, and it asks for the `realdata` fixture.
PROBE = "tests/test_analysis_runs.py::test_real_metadata_gives_gold_passages"


def run_probe(realdata, require: bool) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "MAPS_TRAIN_REQUIRE_REALDATA"}
    environment["MAPS_TRAIN_REALDATA"] = str(realdata)
    if require:
        environment["MAPS_TRAIN_REQUIRE_REALDATA"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", PROBE, "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=300,
    )


def partial_realdata(root):
    """Every real-data file the tests read, empty, except the corpus: the gate checks presence, not content."""
    for name in REALDATA_FILES[1:]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def test_missing_realdata_is_counted_in_the_summary(tmp_path):
    result = run_probe(partial_realdata(tmp_path), require=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    expected = f"maps-train: 1 tests skipped: real data missing at {tmp_path}"
    assert expected in result.stdout, result.stdout


def test_missing_realdata_fails_when_required(tmp_path):
    result = run_probe(partial_realdata(tmp_path), require=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout  # the fixture fails: an error of setup, not a skip
    assert f"real data missing: {tmp_path} lacks corpus/corpus.jsonl (MAPS_TRAIN_REQUIRE_REALDATA=1)" in result.stdout
    assert "tests skipped: real data missing" not in result.stdout


def test_hypothesis_keeps_failures_and_prints_their_blob():
    """A failing case is saved under .hypothesis/ (git-ignored) and replayed first by the next run, and its
    `@reproduce_failure` blob is printed: in the default settings and in the ones the parser properties use."""
    from hypothesis import settings
    from test_parse_properties import budget

    for chosen in (settings(), budget(1)):
        assert chosen.print_blob
        assert Path(chosen.database.path) == REPO / ".hypothesis" / "examples"
