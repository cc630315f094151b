"""Resume keys: a question id is written back exactly as it was read, and resuming never deletes a complete trace.

Issue 36's reproducer: an id with a lone surrogate (JSON `"\\ud800"`) was accepted, written as U+FFFD, and so never
matched on resume: every rerun answered it again, and the trace clean-up then deleted complete traces of
answered questions. Now such an id is refused as the file loads (and by the runner, for ids built in code), and a
trace left without its answer line by a kill gets that line back from the trace instead of being deleted.

The agent runs on `ScriptedBackend` and `RecordingRetriever` (named test doubles, tests/scripted_backend.py): what
is tested is the runner's file contract, which a real model would only make slower.
"""

from __future__ import annotations

import json
import re

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents import run_method
from maps_train.errors import MapsTrainError
from maps_train.questions import Question, load_questions
from maps_train.recipe import load_recipe


def run(questions, out):
    backend = ScriptedBackend({"consolidator": consolidator_sufficient_after(1)})
    recipe = load_recipe(None, ["agent.max_rounds=2", "agent.num_directions=2", "agent.schedule=step"])
    records = run_method(recipe, questions, out, backend=backend, retriever=RecordingRetriever(), progress=False)
    return records, backend


def ids_of(path):
    return [json.loads(line)["question_id"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_lone_surrogate_id_is_refused_and_three_runs_leave_one_answer_and_one_trace_per_question(tmp_path):
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text('{"id": "a\\ud800", "question": "first?"}\n{"id": "b", "question": "second?"}\n')
    where = re.escape(f"{questions_file}:1")
    with pytest.raises(MapsTrainError, match=rf"^{where}: id: holds a lone surrogate") as err:
        load_questions(questions_file)
    assert "\n" not in str(err.value)

    # Built in code rather than loaded: the runner refuses it before any call, and writes nothing.
    out = tmp_path / "out"
    with pytest.raises(MapsTrainError, match="lone surrogate"):
        run([Question(id="a\ud800", question="first?")], out)
    assert not (out / "answers.jsonl").exists()

    # The id written as valid text (here non-ASCII): three runs, the second after a kill between the second
    # question's trace and its answer line.
    questions_file.write_text('{"id": "a\\u00e9", "question": "first?"}\n{"id": "b", "question": "second?"}\n')
    questions = load_questions(questions_file)
    run(questions, out)
    answers_path, traces_path = out / "answers.jsonl", out / "traces.jsonl"
    whole_answers, whole_traces = answers_path.read_bytes(), traces_path.read_bytes()
    answers_path.write_bytes(whole_answers.splitlines(keepends=True)[0])
    for _ in range(2):
        records, backend = run(load_questions(questions_file), out)
        assert backend.batches == [] and [r.question_id for r in records] == ["a\u00e9", "b"]
    assert ids_of(answers_path) == ["a\u00e9", "b"] and answers_path.read_bytes() == whole_answers
    assert traces_path.read_bytes() == whole_traces  # both complete traces kept, byte for byte


def test_resume_never_deletes_a_complete_trace_even_a_repeated_one(tmp_path):
    """A traces file holding a question twice (left by the old surrogate bug, or two files joined by hand) keeps
    both lines: the clean-up that used to drop repeats deleted complete traces of answered questions."""
    questions = [Question(id=f"q{i}", question=f"question {i}?", golden_answers=[f"a{i}"]) for i in range(2)]
    out = tmp_path / "out"
    run(questions, out)
    traces_path = out / "traces.jsonl"
    lines = traces_path.read_bytes().splitlines(keepends=True)
    traces_path.write_bytes(b"".join(lines + lines[:1]))
    before = traces_path.read_bytes()
    records, backend = run(questions, out)
    assert backend.batches == [] and len(records) == 2
    assert traces_path.read_bytes() == before
    assert ids_of(out / "answers.jsonl") == ["q0", "q1"]
