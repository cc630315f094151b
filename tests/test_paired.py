"""Paired bootstrap intervals between two systems on the same questions, checked against cases worked by hand."""

from __future__ import annotations

import pytest

from maps_train.errors import MapsTrainError
from maps_train.evaluate.paired import compare, comparison_table, paired_bootstrap, paired_rows, transfer


def test_a_constant_difference_has_a_point_interval():
    assert paired_bootstrap([0.2, 0.5, 0.1], [0.3, 0.6, 0.2]) == pytest.approx((0.1, 0.1))
    assert paired_bootstrap([1, 0, 1], [1, 0, 1]) == (0.0, 0.0)


def test_one_win_in_four_is_not_significant():
    # Differences [1, 0, 0, 0]: a resample's mean is k/4 with k ~ Binomial(4, 1/4). P(k = 0) = 0.32 > 2.5%, so the
    # interval starts at 0; P(k >= 3) = 0.051 > 2.5% and P(k = 4) = 0.004 < 2.5%, so it ends at 3/4.
    assert paired_bootstrap([0, 0, 0, 0], [1, 0, 0, 0]) == pytest.approx((0.0, 0.75))


def test_rows_pair_by_dataset_and_question_only():
    rows = [
        {"system": "a", "dataset": "x", "question_id": "1", "evidence_recall": 0.0},
        {"system": "b", "dataset": "x", "question_id": "1", "evidence_recall": 1.0},
        {"system": "a", "dataset": "y", "question_id": "1", "evidence_recall": 0.5},  # same id, other data set
        {"system": "b", "dataset": "y", "question_id": "1", "evidence_recall": 0.5},
        {"system": "a", "dataset": "x", "question_id": "2", "evidence_recall": 1.0},  # b never answered it
        {"system": "b", "dataset": "x", "question_id": "3", "evidence_recall": None},  # no gold: no figure
    ]
    assert paired_rows(rows, "a", "b", "evidence_recall") == ([0.0, 0.5], [1.0, 0.5])
    result = compare(rows, "a", "b", "evidence_recall", datasets={"x"})
    assert (result.questions, result.difference, result.low, result.high) == (1, 1.0, 1.0, 1.0)
    assert compare(rows, "a", "missing", "em") is None
    with pytest.raises(MapsTrainError, match="unknown 'recall'"):
        paired_rows(rows, "a", "b", "recall")


def test_the_table_shows_scores_times_100_and_costs_as_counted():
    rows = [{"system": s, "dataset": "x", "question_id": str(i), "em": float(s == "b" and i < 3),
             "cost": {"retrievals": 3 if s == "b" else 1, "prompt_tokens": 100, "completion_tokens": 10}}
            for s in ("a", "b") for i in range(4)]
    table = comparison_table(rows, [("a", "b")], ["em", "retrievals", "tokens"])
    assert "| a -> b | EM | 4 | 0.0 | 75.0 | +75.0 | [+25.0, +100.0] | yes |" in table
    assert "| a -> b | Retrievals | 4 | 1.0 | 3.0 | +2.0 | [+2.0, +2.0] | yes |" in table
    assert "| a -> b | Tokens | 4 | 110 | 110 | +0.0 | [+0.0, +0.0] | no |" in table


def test_a_side_joined_with_plus_is_the_per_question_mean_of_its_systems():
    rows = [
        {"system": "sft", "dataset": "x", "question_id": "1", "evidence_recall": 0.0},
        {"system": "sft", "dataset": "x", "question_id": "2", "evidence_recall": 0.5},
        {"system": "rl0", "dataset": "x", "question_id": "1", "evidence_recall": 1.0},
        {"system": "rl0", "dataset": "x", "question_id": "2", "evidence_recall": 0.5},
        {"system": "rl1", "dataset": "x", "question_id": "1", "evidence_recall": 0.5},
        {"system": "rl1", "dataset": "x", "question_id": "2", "evidence_recall": 1.0},
        {"system": "rl1", "dataset": "x", "question_id": "3", "evidence_recall": 1.0},  # rl0 never answered it
        {"system": "sft", "dataset": "x", "question_id": "3", "evidence_recall": 0.0},
    ]
    # Question 1: (1.0 + 0.5) / 2 = 0.75; question 2: 0.75; question 3 is not every seed's, so it is left out.
    assert paired_rows(rows, "sft", "rl0+rl1", "evidence_recall") == ([0.0, 0.5], [0.75, 0.75])
    assert compare(rows, "sft", "rl0+rl1", "evidence_recall").difference == pytest.approx(0.5)


def test_compare_command_reads_labelled_runs_and_refuses_bad_input_in_one_line(tmp_path):
    import json
    import subprocess
    import sys

    from typer.testing import CliRunner

    from maps_train.cli import app

    def write(folder, rows):
        folder.mkdir()
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    # Two runs with a system of the same name: labelled, they stay apart. B - A on recall: +0.25 on each question.
    write(tmp_path / "one", [{"system": "sft", "dataset": "x", "question_id": q, "evidence_recall": 0.25, "em": 0.0}
                             for q in "12"])
    write(tmp_path / "two", [{"system": "sft", "dataset": "x", "question_id": q, "evidence_recall": 0.5, "em": 1.0}
                             for q in "12"])
    runner = CliRunner()
    result = runner.invoke(app, ["compare", "one/sft>two/sft", "-r", f"one={tmp_path / 'one'}",
                                 "-r", f"two={tmp_path / 'two' / 'results.jsonl'}", "-m", "evidence_recall", "-m", "em"])
    assert result.exit_code == 0, result.output
    assert "| one/sft -> two/sft | Evidence recall, retrieved | 2 | 25.0 | 50.0 | +25.0 | [+25.0, +25.0] | yes |" \
        in result.output
    assert "| one/sft -> two/sft | EM | 2 | 0.0 | 100.0 | +100.0 |" in result.output
    for args, message in [
        (["compare", "sft", "-r", str(tmp_path / "one")], "pair 'sft': write it A>B"),
        (["compare", "sft>rl", "-r", str(tmp_path / "one")], "system 'rl' is in no results read (there: sft)"),
        (["compare", "sft>sft", "-r", str(tmp_path / "none")], f"no results file at {tmp_path / 'none'}"),
    ]:
        done = subprocess.run([sys.executable, "-m", "maps_train.cli", *args], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.startswith("maps-train: error: ") and message in done.stderr, \
            done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def triples(measure: str, **systems: list[float | None]) -> list[dict]:
    return [{"system": name, "dataset": "d", "question_id": str(i), measure: value}
            for name, values in systems.items() for i, value in enumerate(values) if value is not None]


def test_transfer_is_the_share_of_the_teachers_lead_closed():
    # base 0 0, teacher 1 1, system 1 0: (0.5 - 0) / (1 - 0) = 0.5. Every resample's gap is 1, so its ratio is the
    # system's resampled mean: 0, 0.5 or 1 with chances 1/4, 1/2, 1/4; the 2.5th and 97.5th percentiles are 0 and 1.
    rows = triples("em", base=[0, 0], teacher=[1, 1], sft=[1, 0])
    result = transfer(rows, "sft", "base", "teacher", "em")
    assert (result.questions, result.ratio, result.low, result.high, result.undefined) == (2, 0.5, 0.0, 1.0, 0)
    # a system past the teacher is above 1, one below the base negative: (0.9 - 0.5) / (0.7 - 0.5) = 2
    rows = triples("f1", base=[0.5], teacher=[0.7], rl=[0.9])
    assert transfer(rows, "rl", "base", "teacher", "f1").ratio == pytest.approx(2.0)
    # only questions all three answered count
    rows = triples("em", base=[0, 0, 1], teacher=[1, 1, None], sft=[1, 0, 1])
    assert transfer(rows, "sft", "base", "teacher", "em").questions == 2
    assert transfer(triples("em", base=[0], teacher=[1]), "sft", "base", "teacher", "em") is None


def test_a_transfer_with_no_gap_to_close_is_undefined_and_its_resamples_counted():
    # base 0 1, teacher 1 0: the means are equal, so no ratio. A resample of question 0 twice has gap 1 and ratio
    # (1 - 0) / 1 = 1; of question 1 twice gap -1 and ratio (1 - 1) / -1 = 0; a mixed one (chance 1/2) gap 0: left
    # out and counted.
    rows = triples("evidence_recall", base=[0, 1], teacher=[1, 0], sft=[1, 1])
    result = transfer(rows, "sft", "base", "teacher", "evidence_recall")
    assert result.ratio is None and (result.low, result.high) == (0.0, 1.0)
    assert 4_000 < result.undefined < 6_000
    # every resample without a gap: no interval either
    rows = triples("em", base=[0, 0], teacher=[0, 0], sft=[1, 0])
    result = transfer(rows, "sft", "base", "teacher", "em")
    assert (result.ratio, result.low, result.high, result.undefined) == (None, None, None, 10_000)


def test_compare_refuses_clashing_sources_and_malformed_rows_and_reads_a_path_with_an_equals_sign(tmp_path):
    """Issue 65: through the real CLI, one line and exit 2 each; `./a=b` is read as the path it is."""
    import json
    import subprocess
    import sys

    def write(folder, rows):
        folder.mkdir()
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    row = {"system": "sft", "dataset": "x", "question_id": "1", "evidence_recall": 0.5, "em": 0.0, "rounds": 2,
           "cost": {"retrievals": 3}}
    write(tmp_path / "one", [row, {**row, "system": "base", "evidence_recall": 0.25}])
    write(tmp_path / "two", [row])
    write(tmp_path / "a=b", [row, {**row, "system": "base", "evidence_recall": 0.0}])
    for name, bad in (("abc", {"evidence_recall": "abc"}), ("three", {"rounds": "three"}), ("list", {"cost": [1, 2]}),
                      ("tokens", {"cost": {"prompt_tokens": "many"}})):
        write(tmp_path / name, [row, {**row, "question_id": "2", **bad}])

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "maps_train.cli", "compare", *args], capture_output=True,
                              text=True, cwd=tmp_path)

    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    for args, message in [
        (["base>sft", "-r", one, "-r", two], f"--results {one} and --results {two} both hold system 'sft'; label them"),
        (["base>sft", "-r", one, "-r", one], f"--results {one} and --results {one} both hold system 'sft'"),
        (["a/base>a/sft", "-r", f"a={one}", "-r", f"a={two}"], f"--results a={two}: label 'a' already names"),
        (["base>sft", "-r", str(tmp_path / "abc")], f"{tmp_path / 'abc' / 'results.jsonl'}:2: field 'evidence_recall': "
                                                    "expected a number or null, got \"abc\""),
        (["base>sft", "-r", str(tmp_path / "three")], "results.jsonl:2: field 'rounds': expected a number or null"),
        (["base>sft", "-r", str(tmp_path / "list")], "results.jsonl:2: field 'cost': expected an object or null, got [1, 2]"),
        (["base>sft", "-r", str(tmp_path / "tokens")], "results.jsonl:2: field 'cost.prompt_tokens': expected a number"),
    ]:
        done = cli(*args, "-m", "rounds")
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    # a path holding "=" that exists is that path; a label ends at the first "=" (lab=./a=b)
    done = cli("base>sft", "-r", "./a=b", "-m", "evidence_recall")
    assert done.returncode == 0 and "| base -> sft | Evidence recall, retrieved | 1 | 0.0 | 50.0 | +50.0 |" in done.stdout
    done = cli("lab/base>lab/sft", "-r", "lab=./a=b", "-r", f"o={one}", "-m", "evidence_recall")
    assert done.returncode == 0 and "| lab/base -> lab/sft | Evidence recall, retrieved | 1 |" in done.stdout, done.stderr


def test_compare_gives_each_pairs_b_as_transfer_towards_a_teacher(tmp_path):
    """Base 0.2, teacher 0.8 and a student at 0.5 on every question: transfer 0.5, a point interval; a teacher the
    results lack is one line."""
    import json

    from typer.testing import CliRunner

    from maps_train.cli import app

    values = {"base": 0.2, "teacher": 0.8, "student": 0.5}
    rows = [{"system": system, "dataset": "x", "question_id": q, "evidence_recall": value, "em": value, "tokens": 9}
            for system, value in values.items() for q in "123"]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    runner = CliRunner()
    result = runner.invoke(app, ["compare", "base>student", "-r", str(tmp_path), "-m", "evidence_recall", "-m", "tokens",
                                 "--transfer", "base>teacher"])
    assert result.exit_code == 0, result.output
    assert "| student | Evidence recall, retrieved | 3 | 20.0 | 80.0 | 50.0 | +0.50 | [+0.50, +0.50] | 0 |" in result.output
    assert "Tokens | 3 | 20.0" not in result.output  # a cost has no transfer row
    missing = runner.invoke(app, ["compare", "base>student", "-r", str(tmp_path), "--transfer", "base>oracle"])
    assert isinstance(missing.exception, MapsTrainError)  # the CLI's main prints it as one line, exit 2
    assert str(missing.exception) == "system 'oracle' is in no results read (there: base, student, teacher)"
