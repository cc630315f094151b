"""Bad input files: every loader answers with ONE line naming the file and line (and field), never a traceback,
and nothing is misread silently (issue 15).

Questions JSONL, recipe YAML, the GPQA CSV, passage corpora (FlashRAG JSONL, DPR TSV), model and adapter folders.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from maps_train.config.yaml_io import read_yaml
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.evaluate.datasets import load_eval_questions, load_gpqa_csv
from maps_train.questions import Question, load_questions
from maps_train.retrieval.corpus import Corpus, find_duplicate_id, require_unique_ids


def one_line_error(call, pattern: str, error: type[Exception] = MapsTrainError) -> str:
    """Run `call`, expect `error` whose message matches `pattern` and fits on one line; return the message."""
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    assert re.search(pattern, message), message
    return message


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def jsonl(path: Path, *rows: object) -> Path:
    """Rows as JSONL; a str row is written as it is (for broken lines)."""
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = {"id": "q1", "question": "Where is the Louvre?", "golden_answers": ["Paris"]}


# --- questions JSONL ------------------------------------------------------------------------------------------------


def test_question_file_bytes_and_json_limits_are_one_line(tmp_path):
    good = json.dumps(GOOD).encode()
    bad_utf8 = write_bytes(tmp_path / "utf8.jsonl", good + b'\n{"id": "q2", "question": "caf\xe9?"}\n')
    one_line_error(lambda: load_questions(bad_utf8), rf"^{bad_utf8}:2: invalid JSON \(not valid UTF-8")
    deep = write_bytes(tmp_path / "deep.jsonl", good + b"\n" + b"[" * 10_000 + b"]" * 10_000 + b"\n")
    one_line_error(lambda: load_questions(deep), rf"^{deep}:2: invalid JSON \(JSON nested deeper than 64 levels\)")
    big = jsonl(tmp_path / "big.jsonl", GOOD, '{"id": ' + "7" * 4301 + ', "question": "q"}')
    one_line_error(lambda: load_questions(big), rf"^{big}:2: invalid JSON \(integer with 4301 digits")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("golden_answers", 5, r"golden_answers: expected a list of strings \(or one string\), got an integer"),
        ("golden_answers", {"a": 1}, r"golden_answers: expected a list of strings \(or one string\), got an object"),
        ("golden_answers", ["Paris", None], r"golden_answers\[1\]: expected a string or a number, got null"),
        ("golden_answers", ["Paris", True], r"golden_answers\[1\]: expected a string or a number, got a boolean"),
        ("golden_answers", [""], r"golden_answers\[0\]: empty answer"),
        ("metadata", [1], r"metadata: expected an object, got a list"),
        ("options", "ABCD", r"options: expected a list of strings, got a string"),
        ("options", 4, r"options: expected a list of strings, got an integer"),
        ("options", ["A", 2], r"options\[1\]: expected a string, got an integer"),
        ("options", [], r"options: empty list"),
        ("id", None, r"id: expected a string or an integer, got null"),
        ("id", True, r"id: expected a string or an integer, got a boolean"),
        ("id", 1.5, r"id: expected a string or an integer, got a number"),
        ("id", ["q"], r"id: expected a string or an integer, got a list"),
        ("id", " ", r"id: empty string"),
        ("question", "", r"question: empty string"),
        ("question", ["Where?"], r"question: expected a string, got a list"),
        ("dataset", 3, r"dataset: expected a string, got an integer"),
    ],
)
def test_question_field_types_are_checked(tmp_path, field, value, message):
    path = jsonl(tmp_path / "q.jsonl", {"id": "q0", "question": "fine?"}, {**GOOD, field: value})
    one_line_error(lambda: load_questions(path), rf"^{path}:2: {message}")


def test_question_fields_are_read_as_meant(tmp_path):
    (tmp_path / "nq").mkdir()
    path = jsonl(
        tmp_path / "nq" / "test.jsonl",  # the data set is named after the folder
        {"question": "no id here?", "golden_answers": "Paris"},  # one alias, not five letters
        {"id": 7, "question": "numbers?", "golden_answers": [1984, 2.5, "x"], "metadata": None},
        {"id": "mc", "question": "pick", "golden_answers": ["B"], "options": ["a", "b"], "metadata": {"k": 1}},
    )
    first, second, third = load_questions(path)
    assert (first.id, first.golden_answers, first.dataset) == ("nq-1", ["Paris"], "nq")  # absent id: generated
    assert (second.id, second.golden_answers, second.metadata) == ("7", ["1984", "2.5", "x"], {})
    assert (third.options, third.metadata) == (["a", "b"], {"k": 1})
    # the same checks through the dataclass, with the caller's place in the message
    assert Question.from_dict({"id": "a", "question": "q", "golden_answers": "Rome"}).golden_answers == ["Rome"]
    one_line_error(lambda: Question.from_dict({"id": None, "question": "q"}, where="hub[3]"), r"^hub\[3\]: id: ")


def test_duplicate_question_ids_name_the_file_and_both_lines(tmp_path):
    path = jsonl(tmp_path / "q.jsonl", GOOD, {**GOOD, "id": "q2"}, "", {**GOOD, "id": "q1"})
    one_line_error(lambda: load_questions(path), rf"^{path}:4: id: question id 'q1' appears twice \(first at line 1\)")
    # a generated id that collides with a written one is caught the same way
    clash = jsonl(tmp_path / "clash.jsonl", {**GOOD, "id": "set-2"}, {"question": "no id"})
    one_line_error(
        lambda: load_eval_questions("set", path=clash), rf"^{clash}:2: id: question id 'set-2' appears twice"
    )


# --- recipe YAML ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, message",
    [
        (b"name: t\nagent:\n  num_directions: \xff\n", r":3: not valid UTF-8 \(byte 0xff\)"),
        (b"agent:\n  max_rounds: 2\n  max_rounds: 3\n", r":3: duplicate key 'max_rounds' \(first at line 2\)"),
        (b"name: a\nagent: {}\nname: b\n", r":3: duplicate key 'name' \(first at line 1\)"),
        (b"name: " + b"[" * 10_000 + b"\n", r":1: invalid YAML \(nested deeper than 64 levels\)"),
        (b"seed: " + b"9" * 4301 + b"\n", r":1: invalid YAML \(integer with 4301 digits"),
        (b"name: t\nagent: x\x00\n", r":2: invalid YAML \(special characters are not allowed"),
        (b"name: 2024-02-30\n", r": invalid YAML \(day is out of range for month\)"),
    ],
)
def test_bad_recipe_bytes_are_one_line(tmp_path, data, message):
    path = write_bytes(tmp_path / "recipe.yaml", data)
    one_line_error(lambda: read_yaml(path), rf"^{path}{message}", ConfigError)


def test_recipe_bom_and_merge_keys_still_load(tmp_path):
    assert read_yaml(write_bytes(tmp_path / "bom.yaml", b"\xef\xbb\xbfname: t\n")) == {"name": "t"}
    merged = write_bytes(tmp_path / "merge.yaml", b"base: &b\n  x: 1\n  y: 2\nother:\n  <<: *b\n  x: 3\n")
    assert read_yaml(merged)["other"] == {"x": 3, "y": 2}  # overriding a merged key is not a duplicate


# --- GPQA CSV -------------------------------------------------------------------------------------------------------

GPQA_HEADER = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
               "Incorrect Answer 3"]


def gpqa_row(i: int, question: str | None = None) -> list[str]:
    return [f"rec{i}", question or f"Question {i}?", f"right {i}", f"wrong {i}a", f"wrong {i}b", f"wrong {i}c"]


def write_csv(path: Path, rows: list[list[str]], bom: bool = False) -> Path:
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as handle:
        csv.writer(handle).writerows([GPQA_HEADER, *rows])
    return path


def test_gpqa_bom_keeps_record_ids(tmp_path):
    plain = load_gpqa_csv(write_csv(tmp_path / "plain.csv", [gpqa_row(0), gpqa_row(1)]), seed=3)
    with_bom = load_gpqa_csv(write_csv(tmp_path / "bom.csv", [gpqa_row(0), gpqa_row(1)], bom=True), seed=3)
    assert [q.id for q in with_bom] == ["rec0", "rec1"]
    assert [(q.options, q.golden_answers) for q in with_bom] == [(q.options, q.golden_answers) for q in plain]


def test_gpqa_errors_name_the_file_line(tmp_path):
    # row 2's question spans three lines, so row 3 starts on line 6 of the file
    rows = [gpqa_row(0), gpqa_row(1, "first\nsecond\nthird"), gpqa_row(2)[:3] + ["", "b", "c"]]
    path = write_csv(tmp_path / "gpqa.csv", rows)
    one_line_error(lambda: load_gpqa_csv(path), rf"^{path}:6: missing or empty column 'Incorrect Answer 1'")
    dup = write_csv(tmp_path / "dup.csv", [gpqa_row(0), gpqa_row(1), gpqa_row(0)])
    one_line_error(lambda: load_gpqa_csv(dup), rf"^{dup}:4: id: question id 'rec0' appears twice \(first at line 2\)")
    extra = write_csv(tmp_path / "extra.csv", [gpqa_row(0), [*gpqa_row(1), "stray"]])
    one_line_error(lambda: load_gpqa_csv(extra), rf"^{extra}:3: 7 cells but the header names 6 columns")
    header_only = tmp_path / "header.csv"
    header_only.write_text("Question,Correct Answer\n")
    one_line_error(lambda: load_gpqa_csv(header_only), rf"^{header_only}:1: missing column 'Incorrect Answer 1'")


def test_gpqa_bad_bytes_and_huge_cells(tmp_path):
    good = write_csv(tmp_path / "good.csv", [gpqa_row(0), gpqa_row(1)]).read_bytes()
    bad = write_bytes(tmp_path / "bytes.csv", good.replace(b"right 1", b"right \xff"))
    one_line_error(lambda: load_gpqa_csv(bad), rf"^{bad}:3: not valid UTF-8 \(byte 0xff\)")
    huge = write_csv(tmp_path / "huge.csv", [gpqa_row(0), gpqa_row(1, "x" * 131_073)])
    one_line_error(lambda: load_gpqa_csv(huge), rf"^{huge}:3: a cell is longer than 131072 characters")


# --- passage corpora ------------------------------------------------------------------------------------------------


def test_tsv_header_behind_a_bom_is_not_a_passage(tmp_path):
    path = write_bytes(tmp_path / "psgs.tsv", b"\xef\xbb\xbfid\ttext\ttitle\n1\talpha\tA\n2\tbeta\tB\n")
    corpus = Corpus(path)
    assert len(corpus) == 2 and [corpus[0].id, corpus[1].id] == ["1", "2"]
    no_header = write_bytes(tmp_path / "nohead.tsv", b"\xef\xbb\xbf1\talpha\tA\n")
    assert Corpus(no_header)[0].id == "1"  # the BOM is not part of the first id
    jsonl_bom = write_bytes(tmp_path / "c.jsonl", b'\xef\xbb\xbf{"id": "a", "contents": "A\\nalpha"}\n')
    assert Corpus(jsonl_bom)[0].title == "A"


def test_corpus_rows_beyond_limits_are_one_line(tmp_path):
    huge = tmp_path / "huge.tsv"
    huge.write_text("1\tfine\tA\n2\t" + "x" * 131_073 + "\tB\n")
    one_line_error(lambda: Corpus(huge)[1], rf"^{huge}:2: a field is longer than 131072 characters")
    deep = write_bytes(tmp_path / "deep.jsonl", b'{"id": "a", "text": "t"}\n{"id": ' + b"[" * 10_000 + b"\n")
    one_line_error(lambda: Corpus(deep)[1], rf"^{deep}:2: invalid JSON")
    big = jsonl(tmp_path / "big.jsonl", '{"id": ' + "7" * 4301 + ', "text": "t"}')
    one_line_error(lambda: Corpus(big)[0], rf"^{big}:1: invalid JSON \(Exceeds the limit \(4300 digits\)")
    bad = write_bytes(tmp_path / "bad.tsv", b"1\tcaf\xe9\tA\n")
    one_line_error(lambda: Corpus(bad)[0], rf"^{bad}:1: not valid UTF-8")


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": None, "text": "t"}, r"id: expected a string or an integer, got null"),
        ({"id": True, "text": "t"}, r"id: expected a string or an integer, got boolean"),
        ({"id": "", "text": "t"}, r"id: empty"),
        ({"id": "a", "contents": ["t"]}, r"contents: expected a string, got list"),
        ({"id": "a", "title": 5, "text": "t"}, r"title: expected a string, got integer"),
    ],
)
def test_corpus_field_types_are_checked(tmp_path, row, message):
    path = jsonl(tmp_path / "c.jsonl", row)
    one_line_error(lambda: Corpus(path)[0], rf"^{path}:1: {message}")


def test_duplicate_passage_ids_stop_the_build(tmp_path):
    from maps_train.recipe import RetrievalConfig
    from maps_train.retrieval.build import build_dense_index, build_index

    path = tmp_path / "c.jsonl"
    jsonl(path, *({"id": f"p{i}", "text": f"t{i}"} for i in range(5)), "", {"id": "p3", "text": "again"},
          {"id": "p1", "text": "again"})
    corpus = Corpus(path)
    assert find_duplicate_id(corpus) == ("p3", 3, 5)  # the first repeat in file order, by row
    expected = rf"^{path}:7: passage id 'p3' appears twice \(first at line 4\); ids must be unique$"
    one_line_error(lambda: require_unique_ids(corpus), expected)
    # both builders refuse before loading an encoder or tokenising anything
    one_line_error(lambda: build_dense_index(path, tmp_path / "dense", show_progress=False), expected)
    settings = RetrievalConfig(kind="bm25", corpus=str(path))
    one_line_error(lambda: build_index(settings, tmp_path / "bm25"), expected)
    assert find_duplicate_id(Corpus(jsonl(tmp_path / "ok.jsonl", {"id": 1, "text": "a"}, {"id": "2", "text": "b"}))) is None


# --- model and adapter folders: safetensors only --------------------------------------------------------------------


def pickled_model(folder: Path, weights: str = "pytorch_model.bin") -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    (folder / weights).write_bytes(b"not really a pickle")
    return folder


def test_model_folder_with_only_pickled_weights_is_refused(tmp_path, monkeypatch):
    import torch

    from maps_train.models import resolve_model

    def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_torch_load)
    folder = pickled_model(tmp_path / "model")
    one_line_error(
        lambda: resolve_model(str(folder)),
        rf"^model '{folder}': {folder} has weights only as pickles \(pytorch_model.bin\), which are not loaded",
    )
    sentence = tmp_path / "st"
    sentence.mkdir()
    pickled_model(sentence / "0_Transformer", "model.pt")  # sentence-transformers keeps module weights in subfolders
    one_line_error(lambda: resolve_model(str(sentence)), r"0_Transformer has weights only as pickles \(model.pt\)")
    (folder / "model.safetensors").write_bytes(b"")  # with safetensors beside them, the pickles are never read
    assert resolve_model(str(folder)) == str(folder)
    tokenizer_only = tmp_path / "tok"
    tokenizer_only.mkdir()
    (tokenizer_only / "tokenizer.json").write_text("{}")
    assert resolve_model(str(tokenizer_only)) == str(tokenizer_only)


def test_adapter_with_only_pickled_weights_is_refused(tmp_path, monkeypatch):
    import torch

    from maps_train.llm.hf_backend import HFBackend
    from maps_train.train.adapter_check import check_adapter

    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    folder = tmp_path / "writer"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "base_model_name_or_path": "base",
    }))
    (folder / "adapter_model.bin").write_bytes(b"not really a pickle")
    problems = check_adapter(folder)
    assert problems == [
        "adapter_model.bin without adapter_model.safetensors: pickled weights are not loaded (torch.load can run "
        "code); save the adapter with safe_serialization=True"
    ]
    backend = object.__new__(HFBackend)  # no base model needed: the folder is refused before PEFT is reached
    backend._adapters = {}
    one_line_error(
        lambda: backend.load_adapter(str(folder), role="writer"),
        rf"^roles.writer.adapter: {folder} has no adapter_model.safetensors \(only adapter_model.bin, which is not "
        r"loaded",
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_bytes(b'{"r": \xff}')
    one_line_error(lambda: check_adapter(broken), rf"^{broken}/adapter_config.json: invalid JSON \(not valid UTF-8")


def test_hub_rows_are_checked_like_file_rows(monkeypatch):
    from maps_train.evaluate import datasets

    rows = [{"id": "a", "question": "q?", "golden_answers": "Paris"}, {"id": None, "question": "q?"}]
    monkeypatch.setattr(datasets, "load_hub_rows", lambda *args: rows[:1])
    assert load_eval_questions("nq", hub="org/set")[0].golden_answers == ["Paris"]
    rows[1:] = [{"id": "", "question": "no id?"}, {"id": "a", "question": "again?"}]  # "" is generated as nq-2
    monkeypatch.setattr(datasets, "load_hub_rows", lambda *args: rows)
    one_line_error(
        lambda: load_eval_questions("nq", hub="org/set"),
        r"^org/set:nq/test\[3\]: id: question id 'a' appears twice \(first at row 1\)",
    )
    rows[1:] = [{"id": "b", "question": "q?", "options": "ABCD"}]
    one_line_error(lambda: load_eval_questions("nq", hub="org/set"), r"^org/set:nq/test\[2\]: options: expected a list")


def test_a_bom_before_the_first_questions_line_is_not_part_of_the_json(tmp_path):
    from maps_train.questions import load_questions

    path = tmp_path / "q.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "q1", "question": "Who?", "golden_answers": ["X"]}\n')
    assert [q.id for q in load_questions(path)] == ["q1"]
