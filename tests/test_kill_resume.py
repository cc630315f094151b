"""Kill and resume: a real `maps-train run` killed with SIGKILL at drawn points and resumed each time ends with
every question answered once, one trace per answer, and both files byte-for-byte valid JSONL; plus the torn-line
rule of `KeyedJsonl` on its own (fast, no subprocess).

The subprocess test uses the tiny Qwen3 (random weights, greedy) on the hf backend and MiniLM over a 16-question
HotpotQA world, so the killed-and-resumed run must also reproduce an uninterrupted run's records exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from maps_train.errors import MapsTrainError
from maps_train.records import KeyedJsonl, TraceRecord, iter_traces
from maps_train.records.trace import restore_lost_answers

# --- the torn-line rule on KeyedJsonl ------------------------------------------------------------------------------


def line(qid: str, answer: str = "x") -> bytes:
    return json.dumps({"question_id": qid, "answer": answer}, ensure_ascii=False).encode() + b"\n"


def test_a_complete_bad_last_line_is_a_one_line_error_and_nothing_is_cut(tmp_path):
    path = tmp_path / "answers.jsonl"
    before = line("q1") + b'{"question_id": "q2", "ans\n'  # ended by a newline: an edit or a bug, never a kill
    path.write_bytes(before)
    store = KeyedJsonl(path)
    for attempt in (store.load, lambda: restore_lost_answers(KeyedJsonl(tmp_path / "a.jsonl"), store, {"q1": {}})):
        with pytest.raises(MapsTrainError, match=rf"^{re.escape(str(path))}:2: invalid JSON") as err:
            attempt()
        assert "\n" not in str(err.value)
        assert path.read_bytes() == before


def test_a_torn_last_line_is_cut_and_the_next_append_starts_a_fresh_line(tmp_path):
    path = tmp_path / "answers.jsonl"
    # Torn inside a two-byte UTF-8 character: the tail is not even valid UTF-8.
    torn = line("q2", "café")[: line("q2", "café").index("é".encode()) + 1]
    path.write_bytes(line("q1") + torn)
    store = KeyedJsonl(path)
    assert list(store.load(repair=False)) == ["q1"] and path.read_bytes() == line("q1") + torn  # readers only look
    assert list(store.load()) == ["q1"] and path.read_bytes() == line("q1")
    with store:
        store.append({"question_id": "q2", "answer": "café"})
    assert path.read_bytes() == line("q1") + line("q2", "café")


def test_a_complete_record_missing_only_its_newline_is_kept_and_finished(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_bytes(line("q1") + line("q2")[:-1])
    store = KeyedJsonl(path)
    assert list(store.load()) == ["q1", "q2"] and path.read_bytes() == line("q1") + line("q2")
    with store:
        store.append({"question_id": "q3", "answer": "x"})
    assert path.read_bytes() == line("q1") + line("q2") + line("q3")


def test_a_lone_surrogate_is_written_as_a_replacement_character(tmp_path):
    path = tmp_path / "answers.jsonl"
    with KeyedJsonl(path) as store:
        store.append({"question_id": "q\ud800", "answer": "a\udfffb"})  # e.g. from a model's JSON "\\ud800" escape
    data = path.read_bytes()
    assert data.endswith(b"\n") and json.loads(data.decode("utf-8")) == {"question_id": "q\ufffd", "answer": "a\ufffdb"}
    assert list(KeyedJsonl(path).load()) == ["q\ufffd"]


# --- a real run, killed and resumed ---------------------------------------------------------------------------------

N_QUESTIONS = 16
SEED = 15
# Where each kill lands: the moment a file reaches a point the run must pass (no timer decides it; the amount is
# drawn from SEED below). "answers": answers.jsonl grew by a drawn number of bytes, up to one mean answer (right
# inside a chunk's burst of appends); "traces": traces.jsonl grew by a drawn number of bytes, up to one mean trace
# (a trace is appended before its answer, so the kill can fall between the two); "line": one more complete answer
# line. Each point lies at most one burst of answers past the last kill (a step chunk of 2, or up to 4 questions
# of the continuous schedule ending in one step), so three kills leave at least 4 of the 16 questions: every run is
# really killed (the test asserts it) and the final one still has work to resume.
SCHEDULE = ("answers", "traces", "line")
RUN_TIMEOUT_S = 300


def latency_free(value):
    """`value` without its wall-clock fields, the only ones two runs of the greedy tiny model may differ in."""
    if isinstance(value, dict):
        return {k: latency_free(v) for k, v in value.items() if not k.endswith("latency_s")}
    if isinstance(value, list):
        return [latency_free(v) for v in value]
    return value


def jsonl_objects(path: Path) -> list[dict]:
    """Every line of `path`, checked byte by byte: newline-terminated, UTF-8, one JSON object each."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path}: last line has no newline"
    rows = []
    for number, raw in enumerate(data[:-1].split(b"\n"), start=1):
        row = json.loads(raw.decode("utf-8"))  # strict: raises on invalid UTF-8 or JSON
        assert isinstance(row, dict), f"{path}:{number}: not an object"
        rows.append(row)
    return rows


def file_state(path: Path) -> tuple[int, bool]:
    """(complete lines, whether the file ends in a torn line without a newline)."""
    data = path.read_bytes() if path.exists() else b""
    return data.count(b"\n"), bool(data) and not data.endswith(b"\n")


def grown_to(path: Path, size: int):
    return lambda: path.exists() and path.stat().st_size >= size


def size_of(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def lines_reach(path: Path, count: int):
    return lambda: file_state(path)[0] >= count


class Run:
    """`maps-train run` in its own process group, output to a log file (a pipe nobody reads could block it)."""

    def __init__(self, world: Path, out: Path, env: dict[str, str], log: Path):
        self.log = log
        args = ["run", str(world / "recipe.yaml"), "--questions", str(world / "questions.jsonl"), "--out", str(out)]
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "maps_train.cli", *args, "--no-progress"],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_until(self, condition) -> bool:
        """Poll until `condition()` holds (True) or the process exits by itself (False); the deadline only turns a
        hang into a failure, it never decides where a kill lands."""
        while self.proc.poll() is None:
            if condition():
                return True
            assert time.monotonic() - self.started < RUN_TIMEOUT_S, f"run hangs:\n{self.output()}"
            time.sleep(0.005)
        return False

    def kill(self) -> None:
        """SIGKILL the whole group; the run must have died of it (not finished or failed just before)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert self.proc.returncode == -signal.SIGKILL, f"exit {self.proc.returncode}, not the kill:\n{self.output()}"

    def finish(self) -> None:
        try:
            self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}:\n{self.output()}"


def build_world(root: Path, realdata: Path, model: str, minilm: str, backend: str, schedule: str) -> dict[str, str]:
    """16 HotpotQA questions with their paragraphs as corpus, a recipe whose roles all run `model` on `backend`,
    the index built; returns the runs' environment."""
    from worlds import write_paragraph_world

    corpus, _, _ = write_paragraph_world(realdata / "hotpotqa" / "dev.jsonl", N_QUESTIONS, root)
    # Passages cut to 60 words: prompts keep no more of each (max_passage_words), and embedding takes half as long.
    rows = [json.loads(row) for row in corpus.read_text().splitlines()]
    corpus.write_text(
        "".join(json.dumps({**r, "contents": " ".join(r["contents"].split(" ")[:60])}) + "\n" for r in rows)
    )
    recipe = {
        "name": "kill-resume",
        # auto_build off: a run that found no index would build one and spend the kill window on embedding.
        "retrieval": {
            "corpus": str(corpus),
            "encoder": minilm,
            "fp16": False,
            "index_dir": str(root / "index"),
            "auto_build": False,
        },
        "backend": {"dtype": "float32", "max_model_len": 4096, "hf_batch_size": 64},
        "roles": {"default": {"backend": backend, "model": model, "max_tokens": 16}},
        # batch_size 2: eight chunks, so answers are appended in several bursts a kill can fall between.
        "agent": {"num_directions": 2, "max_rounds": 2, "top_k": 3, "batch_size": 2, "max_passage_words": 60,
                  "schedule": schedule, "concurrency": 4},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    # One torch thread: on the shared 2-core machine two ran the tiny model about 4x slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    index = subprocess.run(
        [sys.executable, "-m", "maps_train.cli", "index", "build", "--recipe", str(root / "recipe.yaml")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert index.returncode == 0, index.stdout + index.stderr
    return env


@pytest.fixture
def world(tmp_path, realdata, tiny_qwen3, minilm, schedule):
    """The tiny Qwen3 on the hf backend; questions advance by `schedule` (step: chunks of 2; continuous: 4 at a
    time, each written when it ends)."""
    root = tmp_path / "world"
    return root, build_world(root, realdata, tiny_qwen3, minilm, "hf", schedule)


@pytest.mark.slow
def test_a_run_killed_at_drawn_points_and_resumed_matches_an_uninterrupted_run(world, tmp_path):
    root, env = world
    question_ids = [json.loads(q)["id"] for q in (root / "questions.jsonl").read_text().splitlines()]

    reference = tmp_path / "reference"
    Run(root, reference, env, tmp_path / "reference.log").finish()
    ref_answers = (reference / "answers.jsonl").read_bytes().splitlines()
    ref_traces = (reference / "traces.jsonl").read_bytes().splitlines()
    mean_answer_bytes = sum(map(len, ref_answers)) // len(ref_answers)
    mean_trace_bytes = sum(map(len, ref_traces)) // len(ref_traces)

    out = tmp_path / "killed"
    answers_path, traces_path = out / "answers.jsonl", out / "traces.jsonl"
    rng = random.Random(SEED)
    kills = []
    for number, mode in enumerate(SCHEDULE, start=1):
        lines_before = file_state(answers_path)[0]
        if mode == "answers":
            grown = rng.randint(1, mean_answer_bytes)
            where, point = f"answers grew {grown} B", grown_to(answers_path, size_of(answers_path) + grown)
        elif mode == "traces":
            grown = rng.randint(1, mean_trace_bytes)
            where, point = f"traces grew {grown} B", grown_to(traces_path, size_of(traces_path) + grown)
        else:
            where, point = "one more answer line", lines_reach(answers_path, lines_before + 1)
        run = Run(root, out, env, tmp_path / f"kill{number}.log")
        assert run.wait_until(point), f"kill {number} ({where}): the run ended before it\n{run.output()}"
        run.kill()
        (answer_lines, answers_torn), (trace_lines, traces_torn) = file_state(answers_path), file_state(traces_path)
        assert answer_lines < N_QUESTIONS, f"kill {number} ({where}) came after the last answer"
        kills.append(
            f"kill {number} ({mode}, {where}): {answer_lines - lines_before} new answers, {answer_lines} in all; "
            f"{trace_lines} traces; torn tail: answers {'yes' if answers_torn else 'no'}, "
            f"traces {'yes' if traces_torn else 'no'}"
        )

    # Make sure the torn-tail path runs: where the kill left a complete last line, append half of a real record.
    deliberate = []
    for path, lines in ((answers_path, ref_answers), (traces_path, ref_traces)):
        if not file_state(path)[1]:
            with path.open("ab") as sink:
                sink.write(lines[-1][: len(lines[-1]) // 2])
            deliberate.append(path.name)
        assert file_state(path)[1]
    left = N_QUESTIONS - file_state(answers_path)[0]
    final = Run(root, out, env, tmp_path / "final.log")
    final.finish()
    assert f"{N_QUESTIONS} questions -> {out}" in final.output()
    print("\n" + "\n".join(kills))
    print(f"torn tails appended on purpose before the final run: {deliberate or 'none'}; {left} questions left")

    answers, traces = jsonl_objects(answers_path), jsonl_objects(traces_path)
    answer_ids = [a["question_id"] for a in answers]
    assert Counter(answer_ids) == Counter(question_ids)  # every question exactly once
    trace_ids = [t["question_id"] for t in traces]
    assert len(trace_ids) == len(set(trace_ids)) and set(trace_ids) == set(answer_ids)  # one trace per answer
    parsed = list(iter_traces(traces_path))
    assert all(isinstance(t, TraceRecord) for _, t in parsed), [str(t) for _, t in parsed if isinstance(t, Exception)]

    # Greedy decoding: chunks regrouped by the resumes change nothing but the wall-clock fields.
    def by_id(rows):
        return {row["question_id"]: latency_free(row) for row in rows}

    assert by_id(answers) == by_id(json.loads(row) for row in ref_answers)
    assert by_id(traces) == by_id(json.loads(row) for row in ref_traces)


@pytest.mark.slow
def test_a_sigterm_ends_a_run_and_the_vllm_engine_processes_it_started(tmp_path, realdata, tiny_qwen3_vllm, minilm):
    """`kill PID` on a run whose roles run on an in-process vLLM engine: the engine core and its worker are
    processes of their own, and under Python's default SIGTERM they outlived the run, orphaned, holding the
    engine's memory (GPU memory on a GPU). The run must exit as a normal exit does (code 143) and take them along;
    what it wrote reads back, so the next run resumes."""
    import psutil

    root = tmp_path / "world"
    env = build_world(root, realdata, tiny_qwen3_vllm, minilm, "vllm", "step")
    out = tmp_path / "out"
    run = Run(root, out, env, tmp_path / "run.log")
    try:
        assert run.wait_until(lines_reach(out / "answers.jsonl", 1)), f"the run ended before its first answer\n{run.output()}"
        started = psutil.Process(run.proc.pid).children(recursive=True)
        names = [process.name() for process in started]
        assert any(name.startswith("VLLM::EngineCor") for name in names), names  # the engine core runs apart
        run.proc.send_signal(signal.SIGTERM)  # to the run's process alone, as `kill PID` does, not to its group
        assert run.proc.wait(timeout=RUN_TIMEOUT_S) == 128 + signal.SIGTERM, run.output()
        _, alive = psutil.wait_procs(started, timeout=60)  # the engine's own shutdown grace is 5 s, then a kill
        assert alive == [], f"still running after the run exited: {[process.name() for process in alive]}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever outlived the run is in its process group
            os.killpg(run.proc.pid, signal.SIGKILL)
    # What it wrote reads back as a next run reads it (a torn last line at most, which that run cuts off).
    answered = KeyedJsonl(out / "answers.jsonl").load(repair=False)
    assert 1 <= len(answered) < N_QUESTIONS, f"{len(answered)} answers: the SIGTERM came after the last"
