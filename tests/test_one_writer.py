"""One writer per run folder (`maps_train.runlock.sole_writer`): a second `run`, `eval` or `train` into a folder
that a first one is writing is refused in one line naming the first (its pid), the first finishes alone and
nothing is written twice; the lock file is never followed through a symbolic link; `rl` refuses a folder that
belongs to another stage and never calls a run that trained no step finished.

The first writer is real and held mid-run by a gate in its backend or runner (a test double that blocks until
the test releases it), so the second really arrives while the first writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend
from test_eval_suite import FixedAnswerRunner, suite_file  # noqa: F401 (suite_file is a fixture)

from maps_train.agents import run_method
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.evaluate.results import read_results
from maps_train.evaluate.suite import run_suite
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.runlock import sole_writer

REPO = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()
QUESTIONS = [Question(id=f"q{i}", question=f"question {i}?", golden_answers=[f"a{i}"], dataset="toy") for i in range(6)]


class Gate:
    """Holds the first caller of `wait()` until `release()`; tells the test when one is held."""

    def __init__(self):
        self.held = threading.Event()
        self.opened = threading.Event()

    def wait(self):
        if not self.held.is_set():
            self.held.set()
            assert self.opened.wait(60), "the test never released the gate"

    def release(self):
        self.opened.set()


class GatedBackend(ScriptedBackend):
    def __init__(self, gate: Gate):
        super().__init__()
        self.gate = gate

    def generate(self, requests, routes=None):
        self.gate.wait()
        return super().generate(requests, routes)


class Background(threading.Thread):
    """A call on a thread of its own, its result or error kept for the test."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.result, self.error = call, None, None
        self.start()

    def run(self):
        try:
            self.result = self.call()
        except BaseException as err:  # noqa: BLE001 - re-raised by the test
            self.error = err


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def answer(out: Path, backend) -> list:
    recipe = load_recipe(None, ["agent.max_rounds=1", "agent.schedule=step", "agent.batch_size=2"])
    return run_method(recipe, QUESTIONS, out, backend=backend, retriever=RecordingRetriever(), progress=False)


def test_a_second_run_into_a_folder_being_written_is_refused_and_nothing_is_written_twice(tmp_path):
    gate = Gate()
    first = Background(lambda: answer(tmp_path / "run", GatedBackend(gate)))
    assert gate.held.wait(60), first.error
    try:
        with pytest.raises(MapsTrainError) as err:
            answer(tmp_path / "run", ScriptedBackend())
    finally:
        gate.release()
        first.join(60)
    assert one_line(err) == (f"{tmp_path / 'run'}: maps-train (maps answers and traces) on {HOST} is already writing here "
                             f"(pid {os.getpid()}); wait for it to end or use another output folder")
    assert first.error is None and len(first.result) == len(QUESTIONS)
    for name in ("answers.jsonl", "traces.jsonl"):
        ids = [json.loads(line)["question_id"] for line in (tmp_path / "run" / name).read_text().splitlines()]
        assert sorted(ids) == sorted(q.id for q in QUESTIONS), name  # each question once
    assert len(answer(tmp_path / "run", ScriptedBackend())) == len(QUESTIONS)  # the lock went with its holder


class GatedRunner(FixedAnswerRunner):
    def __init__(self, gate: Gate):
        super().__init__()
        self.gate = gate

    def __call__(self, recipe, questions, out_dir, progress=True):
        self.gate.wait()
        return super().__call__(recipe, questions, out_dir, progress)


def test_a_second_eval_of_a_suite_being_run_is_refused_and_no_result_is_duplicated(suite_file):  # noqa: F811
    gate = Gate()
    first = Background(lambda: run_suite(suite_file, ["wandb.enabled=false"], runner=GatedRunner(gate),
                                         progress=False))
    assert gate.held.wait(60), first.error
    try:
        with pytest.raises(MapsTrainError, match=r"out: maps-train eval on .* is already writing here \(pid \d+\)") as err:
            run_suite(suite_file, ["wandb.enabled=false"], runner=FixedAnswerRunner(), progress=False)
    finally:
        gate.release()
        first.join(120)
    one_line(err)
    assert first.error is None, first.error
    rows = read_results(first.result.results_path)
    keys = [(row["system"], row["dataset"], row["question_id"]) for row in rows]
    assert len(keys) == len(set(keys)) == first.result.scored > 0


def test_a_second_train_of_an_adapter_being_trained_is_refused_naming_the_first(tmp_path, capsys):
    from maps_train.train.__main__ import main
    from maps_train.train.sft import distributed_state, sole_trainer

    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(f"name: lock\ntrain:\n  output_dir: {tmp_path / 'adapters'}\n")
    recipe = load_recipe(str(recipe_path))
    with sole_trainer(recipe, "writer", distributed_state()):  # the first `train` of the adapter, mid-run
        assert main(["--config", str(recipe_path), "--role", "writer"]) == 2
    assert capsys.readouterr().err == (
        f"maps-train: error: {tmp_path / 'adapters' / '_trainer'}: maps-train train (writer) on {HOST} is already "
        "writing here "
        f"(pid {os.getpid()}); wait for it to end or use another output folder\n")


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").symlink_to(target)
    with pytest.raises(MapsTrainError) as err, sole_writer(folder, "maps-train run"):
        pass
    assert one_line(err).startswith(f"{folder / '.lock'}: is a symbolic link")
    assert target.read_text() == "keep me\n"


def test_the_holder_of_a_killed_run_does_not_block_the_next(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from maps_train.runlock import sole_writer\n"
         f"with sole_writer(Path({str(folder)!r}), 'maps-train run'):\n print('held', flush=True); sys.stdin.read()"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(MapsTrainError, match=rf"maps-train run on .* is already writing here \(pid {holder.pid}\)"):
        with sole_writer(folder, "maps-train eval"):
            pass
    holder.kill()
    holder.wait(30)
    with sole_writer(folder, "maps-train eval"):
        assert (folder / ".lock").read_text().splitlines()[0] == f"pid {os.getpid()}"


# --- rl: its own folder, and no step is not finished ----------------------------------------------------------------


def test_rl_into_the_sft_output_folder_is_refused_before_anything_loads(tmp_path):
    from maps_train.rl.trainer import rl_stage

    sft = tmp_path / "adapters"
    recipe = load_recipe(None, [f"train.output_dir={sft}", f"rl.output_dir={sft}/", "rl.roles=[consolidator]"])
    with pytest.raises(ConfigError) as err:
        rl_stage(recipe)
    assert one_line(err).startswith(f"rl.output_dir: {sft}/ is train.output_dir, another stage's folder")


def test_rl_refuses_a_checkpoint_folder_that_sft_training_marked(tmp_path):
    from maps_train.rl.layout import claim_folder
    from maps_train.train.sft import OUTPUT_MARKER

    folder = tmp_path / "_trainer" / "consolidator"
    folder.mkdir(parents=True)
    (folder / OUTPUT_MARKER).write_text(json.dumps({"written_by": "maps-train", "adapter": "consolidator"}) + "\n")
    (folder / "checkpoint-3").mkdir()
    with pytest.raises(MapsTrainError) as err:
        claim_folder(folder, "consolidator")
    assert one_line(err) == (f"{folder}: rl would write into it, but it holds another stage's output "
                             f"({OUTPUT_MARKER} says 'maps-train'); set rl.output_dir to a folder of its own")
    claim_folder(tmp_path / "rl" / "_trainer" / "consolidator", "consolidator")  # its own: made and marked
    claim_folder(tmp_path / "rl" / "_trainer" / "consolidator", "consolidator")  # and written into again


def test_rl_with_no_question_to_train_on_is_refused(tmp_path):
    from maps_train.rl.environment import load_rl_questions

    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "which?", "golden_answers": ["a"]}) + "\n")
    recipe = load_recipe(None, [f"rl.questions=[{questions}]", "rl.limit=0"])
    with pytest.raises(ConfigError) as err:
        load_rl_questions(recipe)
    assert one_line(err).startswith("rl.limit: no training questions (0 from ")


def test_an_rl_summary_of_no_step_is_not_finished(tmp_path):
    from maps_train.rl.layout import SUMMARY_FILE, RoleRun

    run = RoleRun.of(load_recipe(None, [f"rl.output_dir={tmp_path / 'rl'}", "rl.roles=[consolidator]"]), "consolidator")
    folder = run.adapter_dir
    folder.mkdir(parents=True)
    summary = {"global_step": 0, "reward_settings": run.reward_settings()}
    (folder / SUMMARY_FILE).write_text(json.dumps(summary))
    assert not run.is_finished()
    (folder / SUMMARY_FILE).write_text(json.dumps({**summary, "global_step": 2}))
    assert run.is_finished()
