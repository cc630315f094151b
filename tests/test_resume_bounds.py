"""Resume reads are bounded like input reads: what a rerun finds at `answers.jsonl` or `traces.jsonl` is read only
when it is a regular file, and only up to a line cap. A link to an endless device, a FIFO nobody writes, or a
sparse file of 16 GiB without a newline is one error line, in bounded memory, before anything runs.

Each case runs `run_method` (the loop of `maps-train run`) in a child process whose address space is capped at
2 GiB, so a reader without a bound fails there (MemoryError) instead of taking the machine's memory, and a
reader that blocks is seen as a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from maps_train.errors import MapsTrainError
from maps_train.jsonl import MAX_RECORD_LINE_BYTES
from maps_train.records.store import KeyedJsonl

TESTS = Path(__file__).resolve().parent
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, {tests!r})
from scripted_backend import RecordingRetriever, ScriptedBackend
from maps_train.agents import run_method
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import load_recipe

questions = [Question(id=f"q{{i}}", question=f"question {{i}}?", golden_answers=["a"], dataset="toy") for i in range(2)]
try:
    run_method(load_recipe(None, ["agent.max_rounds=1"]), questions, {out!r}, backend=ScriptedBackend(),
               retriever=RecordingRetriever(), progress=False)
except MapsTrainError as err:
    print("error:", err)
    sys.exit(2)
print("ran")
"""


def resume(out: Path) -> str:
    """The one line a rerun into `out` ends with (it must end, within 60 s, with a MapsTrainError)."""
    proc = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(TESTS), out=str(out))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("name", ["answers.jsonl", "traces.jsonl"])
def test_a_link_to_an_endless_device_is_one_line(tmp_path, name):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).symlink_to("/dev/zero")
    assert resume(out) == f"error: {out / name}: not a regular file (a FIFO, device or socket, or a link to one); " \
                          "only regular files are read here"


def test_a_fifo_with_no_writer_is_one_line_not_a_wait(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "answers.jsonl")
    assert resume(out).startswith(f"error: {out / 'answers.jsonl'}: not a regular file")


def test_a_sparse_file_without_a_newline_stops_at_the_line_cap(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with (out / "traces.jsonl").open("wb") as handle:
        handle.truncate(16 << 30)  # 16 GiB of zero bytes that take no disk
    assert resume(out) == f"error: {out / 'traces.jsonl'}:1: line longer than {MAX_RECORD_LINE_BYTES:,} bytes"


@pytest.mark.timeout(30)  # opening a FIFO for writing blocks until a reader comes
def test_a_fifo_where_a_record_is_appended_is_one_line(tmp_path):
    path = tmp_path / "results.jsonl"
    os.mkfifo(path)
    with pytest.raises(MapsTrainError, match=r"results.jsonl: cannot append: No such device or address$"):
        KeyedJsonl(path).append({"question_id": "q0"})
