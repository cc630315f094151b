"""Evaluation data sets: the real files load as they are, GPQA's CSV with a seeded shuffle, seeded sampling."""

from __future__ import annotations

import csv

import pytest

from maps_train.errors import MapsTrainError
from maps_train.evaluate.datasets import DATASETS, load_eval_questions, load_gpqa_csv, sample
from maps_train.questions import Question
from maps_train.records.metrics import LETTERS

REALDATA_FILES = {
    "hotpotqa": ("hotpotqa/dev.jsonl", 712),
    "2wikimultihopqa": ("2wikimultihopqa/dev.jsonl", 128),
    "musique": ("musique/dev.jsonl", 220),
    "popqa": ("popqa/test.jsonl", 764),
    "nq": ("nq/test.jsonl", 2680),
}


@pytest.mark.parametrize("name", sorted(REALDATA_FILES))
def test_realdata_loads_as_is(realdata, name):
    relative, rows = REALDATA_FILES[name]
    # through the registry's default layout <data_root>/<name>/<split>.jsonl ...
    questions = load_eval_questions(name, data_root=realdata)
    assert len(questions) == rows
    assert all(q.dataset == name and q.question and q.golden_answers and q.options is None for q in questions)
    assert len({q.id for q in questions}) == rows
    # ... and through an explicit path
    assert [q.id for q in load_eval_questions(name, path=realdata / relative)] == [q.id for q in questions]
    assert DATASETS[name].answer_mode == "short"


def test_missing_local_file_names_the_path_and_the_fixes(tmp_path):
    with pytest.raises(MapsTrainError, match=r"dataset 'nq': .*nq/test.jsonl not found; .*`hub: RUC-NLPIR/FlashRAG_datasets`"):
        load_eval_questions("nq", data_root=tmp_path)
    with pytest.raises(MapsTrainError, match=r"dataset 'mine': not a known data set"):
        load_eval_questions("mine")


def test_hub_offline_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MapsTrainError, match=r"hub set RUC-NLPIR/FlashRAG_datasets \(nq/test\) needs the network"):
        load_eval_questions("nq", hub="RUC-NLPIR/FlashRAG_datasets")


def write_gpqa(path, rows):
    header = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
              "Subdomain", "High-level domain"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


GPQA_ROWS = [
    [f"rec{i}", f"Question {i}, with a comma?", f"right {i}", f"wrong {i}a", f"wrong {i}b", f"wrong {i}c", "Physics", "Physics"]
    for i in range(12)
]


def test_gpqa_csv_seeded_shuffle_and_letter_gold(tmp_path):
    path = write_gpqa(tmp_path / "gpqa_diamond.csv", GPQA_ROWS)
    first = load_gpqa_csv(path, seed=7)
    again = load_gpqa_csv(path, seed=7)
    other = load_gpqa_csv(path, seed=8)
    assert len(first) == 12
    for question, row in zip(first, GPQA_ROWS):
        assert question.id == row[0] and question.dataset == "gpqa"
        assert sorted(question.options) == sorted(row[2:6])
        letter = question.golden_answers[0]
        assert letter in "ABCD" and question.options[LETTERS.index(letter)] == row[2]
        assert question.metadata["shuffle_seed"] == 7 and question.metadata["correct_answer"] == row[2]
    assert [q.options for q in first] == [q.options for q in again]
    assert [q.options for q in first] != [q.options for q in other]
    # the correct answer is not stuck in one position
    assert len({q.golden_answers[0] for q in first}) > 1
    # the shuffle of a question does not depend on the other rows
    alone = load_gpqa_csv(write_gpqa(tmp_path / "one.csv", GPQA_ROWS[5:6]), seed=7)
    assert alone[0].options == first[5].options
    # through the registry (default file name) too
    (tmp_path / "gpqa").mkdir()
    write_gpqa(tmp_path / "gpqa" / "gpqa_diamond.csv", GPQA_ROWS)
    assert [q.options for q in load_eval_questions("gpqa", data_root=tmp_path, seed=7)] == [q.options for q in first]


def test_gpqa_csv_errors_name_file_line_and_column(tmp_path):
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("Question,Correct Answer\nq,a\n")
    with pytest.raises(MapsTrainError, match=r"bad.csv:1: missing column 'Incorrect Answer 1'"):
        load_gpqa_csv(bad_header)
    empty_cell = write_gpqa(tmp_path / "empty.csv", [GPQA_ROWS[0], ["r1", "q", "a", "", "c", "d", "", ""]])
    with pytest.raises(MapsTrainError, match=r"empty.csv:3: missing or empty column 'Incorrect Answer 1'"):
        load_gpqa_csv(empty_cell)


def test_sample_is_seeded_nested_and_recorded():
    questions = [Question(id=str(i), question=f"q{i}", golden_answers=["a"]) for i in range(50)]
    ten = sample(questions, 10, seed=3)
    assert [q.id for q in ten] == [q.id for q in sample(questions, 10, seed=3)]
    assert [q.id for q in ten] != [q.id for q in sample(questions, 10, seed=4)]
    assert [q.id for q in sample(questions, 20, seed=3)][:10] == [q.id for q in ten]  # nested
    assert ten[0].metadata["sample"] == {"seed": 3, "n": 10, "population": 50}
    assert "sample" not in questions[0].metadata  # the originals are untouched
    everything = sample(questions, None, seed=3)
    assert sorted(q.id for q in everything) == sorted(q.id for q in questions)
    assert len(sample(questions, 1000, seed=3)) == 50
