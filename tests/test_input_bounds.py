"""Bad input is refused as it loads, and OS errors are one line naming the path (issue 36).

Each test is one of the issue's reproducers: a huge question line, an over-long question or option, eleven
options, a CSV header naming a column twice, a data set name that depended on how the path was spelled, and OS
errors (a folder or a symlink loop where answers.jsonl goes, a full disk, a read error, a crash while writing
samples.json). A full disk is the real one (`/dev/full`). A failing disk read and a crash mid-write cannot be made
on demand, so `EIOFile` and `crash_while_writing` stand in for them (named test doubles).
"""

from __future__ import annotations

import csv
import errno
import json
import os
import sys
import tracemalloc
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend

from maps_train import cli, jsonl
from maps_train.agents import run_method
from maps_train.errors import MapsTrainError
from maps_train.evaluate.datasets import load_gpqa_csv
from maps_train.evaluate.suite import run_suite
from maps_train.questions import MAX_LINE_BYTES, MAX_OPTION_CHARS, MAX_OPTIONS, MAX_QUESTION_CHARS, load_questions
from maps_train.recipe import load_recipe
from maps_train.records import KeyedJsonl
from maps_train.records.metrics import LETTERS


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def one_line_error(err: pytest.ExceptionInfo, starts_with: str) -> str:
    message = str(err.value)
    assert "\n" not in message and message.startswith(starts_with), message
    return message


# --- sizes, checked as each line loads ------------------------------------------------------------------------------


def test_a_50_mb_question_line_is_refused_without_being_held(tmp_path):
    path = tmp_path / "questions.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"id": "q1", "question": "ok?"}\n{"id": "q2", "question": "')
        handle.write(b"x" * (50 * 1024 * 1024))
        handle.write(b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(MapsTrainError) as err:
            load_questions(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_line_error(err, f"{path}:2: line longer than {MAX_LINE_BYTES:,} bytes")
    assert peak < 3 * MAX_LINE_BYTES  # read up to the cap, never the 50 MB line


def test_an_over_long_question_or_option_is_refused_naming_file_line_and_field(tmp_path):
    long_question = write_rows(tmp_path / "a.jsonl", [{"id": "q1", "question": "x" * (MAX_QUESTION_CHARS + 1)}])
    with pytest.raises(MapsTrainError) as err:
        load_questions(long_question)
    one_line_error(err, f"{long_question}:1: question: {MAX_QUESTION_CHARS + 1:,} characters")
    long_option = write_rows(tmp_path / "b.jsonl", [
        {"id": "q1", "question": "which?", "options": ["short", "y" * (MAX_OPTION_CHARS + 1)], "golden_answers": ["A"]}
    ])
    with pytest.raises(MapsTrainError) as err:
        load_questions(long_option)
    one_line_error(err, f"{long_option}:1: options[1]: {MAX_OPTION_CHARS + 1:,} characters")
    at_the_bound = write_rows(tmp_path / "c.jsonl", [{"id": "q1", "question": "x" * MAX_QUESTION_CHARS}])
    assert len(load_questions(at_the_bound)[0].question) == MAX_QUESTION_CHARS


def test_eleven_options_are_refused_at_load_before_any_model_runs(tmp_path):
    assert MAX_OPTIONS == len(LETTERS)  # one option per letter scoring can name
    path = write_rows(tmp_path / "choice.jsonl", [
        {"id": "q1", "question": "ten?", "options": [f"o{i}" for i in range(10)], "golden_answers": ["J"]},
        {"id": "q2", "question": "eleven?", "options": [f"o{i}" for i in range(11)], "golden_answers": ["K"]},
    ])
    with pytest.raises(MapsTrainError) as err:
        load_questions(path)
    one_line_error(err, f"{path}:2: options: 11 options, at most 10")


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    path = tmp_path / "gpqa.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                         "Incorrect Answer 3", "Correct Answer"])
        writer.writerow(["g1", "which?", "right", "w1", "w2", "w3", "a later column"])
    with pytest.raises(MapsTrainError) as err:
        load_gpqa_csv(path)
    one_line_error(err, f"{path}:1: column 'Correct Answer' appears twice in the header")


def test_the_data_set_name_does_not_depend_on_how_the_path_is_spelled(tmp_path, monkeypatch):
    path = write_rows(tmp_path / "hotpotqa" / "dev.jsonl", [{"id": "q1", "question": "which?"}])
    spellings = [str(path)]
    monkeypatch.chdir(path.parent)
    names = [load_questions("dev.jsonl")[0].dataset, load_questions("./dev.jsonl")[0].dataset]
    monkeypatch.chdir(tmp_path)
    spellings += ["hotpotqa/dev.jsonl", "hotpotqa/../hotpotqa/dev.jsonl"]
    names += [load_questions(spelling)[0].dataset for spelling in spellings]
    assert names == ["hotpotqa"] * 5


# --- OS errors: one line naming the path ----------------------------------------------------------------------------


def run_two(out: Path) -> ScriptedBackend:
    backend = ScriptedBackend()
    questions = load_questions(write_rows(out.parent / "q" / "questions.jsonl", [
        {"id": "q1", "question": "first?"}, {"id": "q2", "question": "second?"},
    ]))
    run_method(load_recipe(None, ["agent.max_rounds=1"]), questions, out, backend=backend,
               retriever=RecordingRetriever(), progress=False)
    return backend


def test_answers_path_that_is_a_folder_is_one_line_before_any_model_call(tmp_path):
    out = tmp_path / "out"
    (out / "answers.jsonl").mkdir(parents=True)
    backend = ScriptedBackend()
    with pytest.raises(MapsTrainError) as err:
        backend = run_two(out)
    one_line_error(err, f"{out / 'answers.jsonl'}: cannot read: Is a directory")
    assert backend.batches == []


def test_answers_path_in_a_symlink_loop_is_one_line_before_any_model_call(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "answers.jsonl").symlink_to(out / "answers.jsonl")
    with pytest.raises(MapsTrainError) as err:
        run_two(out)
    one_line_error(err, f"{out / 'answers.jsonl'}: cannot read: Too many levels of symbolic links")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (a device that is always full)")
def test_a_full_disk_while_appending_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.symlink_to("/dev/full")
    with pytest.raises(MapsTrainError) as err, KeyedJsonl(path) as store:
        store.append({"question_id": "q1", "answer": "x"})
    one_line_error(err, f"{path}: cannot append: No space left on device")


class EIOFile:
    """Test double: an open file whose every read fails with EIO, as on a failing disk."""

    def __enter__(self) -> EIOFile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def readline(self, *args: object) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def __iter__(self) -> EIOFile:
        return self

    def __next__(self) -> bytes:
        return self.readline()


def test_a_read_error_is_one_line_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"question_id": "q1", "answer": "x"}\n')
    real_open = jsonl.open_regular
    monkeypatch.setattr(jsonl, "open_regular", lambda where, *a: EIOFile() if where == path else real_open(where, *a))
    with pytest.raises(MapsTrainError) as err:
        KeyedJsonl(path).load()
    one_line_error(err, f"{path}: cannot read: Input/output error")


def test_the_cli_prints_an_os_error_as_one_line_with_exit_code_2(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    (out / "answers.jsonl").mkdir(parents=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: tiny\n")
    questions = write_rows(tmp_path / "q" / "questions.jsonl", [{"id": "q1", "question": "first?"}])
    monkeypatch.setattr(cli, "apply_runtime_defaults", lambda: None)  # leave this process's environment alone
    argv = ["maps-train", "run", str(recipe), "--questions", str(questions), "--out", str(out), "--no-progress"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"maps-train: error: {out / 'answers.jsonl'}: cannot read: Is a directory\n"

    # Any OSError that reaches the top, a store's or a library's, is one line naming its path.
    def full_disk() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "index" / "embeddings.f16"))

    monkeypatch.setattr(cli, "app", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"maps-train: error: {tmp_path / 'index' / 'embeddings.f16'}: No space left on device\n"
    )


# --- samples.json: written atomically, read as a one-line error when damaged ----------------------------------------


@pytest.fixture()
def small_suite(tmp_path) -> Path:
    write_rows(tmp_path / "data" / "nq" / "test.jsonl", [{"id": f"nq{i}", "question": f"q {i}?"} for i in range(3)])
    (tmp_path / "recipe.yaml").write_text("name: tiny\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: unit\nout_dir: {tmp_path / 'out'}\ndata_root: {tmp_path / 'data'}\n"
                     "datasets:\n  - {name: nq}\nsystems:\n  - {name: maps, recipe: recipe.yaml}\n")
    return suite


def never_called_runner(recipe, questions, out_dir, progress=True):
    raise AssertionError("the suite must stop before any run")


def test_a_crash_while_writing_samples_json_leaves_the_old_file(small_suite, monkeypatch):
    samples_path = small_suite.parent / "out" / "samples.json"
    samples_path.parent.mkdir()
    before = json.dumps({"popqa": {"seed": 0, "n": 1, "population": 1, "question_ids": ["p1"]}})
    samples_path.write_text(before)
    real_write_text = Path.write_text

    def crash_while_writing(self, text, *args, **kwargs):
        """Test double: the disk fills half-way through writing samples.json (or its temporary file)."""
        if "samples.json" not in self.name:
            return real_write_text(self, text, *args, **kwargs)
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", crash_while_writing)
    with pytest.raises(OSError) as err:
        run_suite(small_suite, runner=never_called_runner, progress=False)
    assert samples_path.read_text() == before
    assert str(err.value) == f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: '{samples_path}'"  # names the file
    assert sorted(p.name for p in samples_path.parent.iterdir()) == [".lock", "samples.json", "suite.yaml"]  # no half file


def test_a_torn_samples_json_is_a_one_line_error(small_suite):
    samples_path = small_suite.parent / "out" / "samples.json"
    samples_path.parent.mkdir()
    samples_path.write_text('{"popqa": {"seed": 0, "n": 1, "popul')
    with pytest.raises(MapsTrainError) as err:
        run_suite(small_suite, runner=never_called_runner, progress=False)
    one_line_error(err, f"{samples_path}: invalid JSON")
    assert samples_path.read_text() == '{"popqa": {"seed": 0, "n": 1, "popul'
