"""The learning study's pieces: the seeded train/dev split of the real questions (disjoint, gold passages only,
the same on a rerun, the committed ids in docs/data), and its report of paired intervals between stages."""

from __future__ import annotations

import json

import pytest

from maps_train.errors import MapsTrainError
from maps_train.records.evidence import gold_evidence
from maps_train.study.report import study_pairs, write_study_report
from maps_train.study.split import split_questions


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_split_is_seeded_disjoint_and_the_one_the_docs_name(realdata, tmp_path, repo_root):
    record = split_questions(realdata, tmp_path / "a", dev=38, train=25, seed=0)
    again = split_questions(realdata, tmp_path / "b", dev=38, train=25, seed=0)
    assert record == again and (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()
    # the split the learning study ran (docs/learning-study.md) is this one
    assert record == json.loads((repo_root / "docs" / "data" / "learning-study-split.json").read_text())
    train = read_jsonl(tmp_path / "a" / "train.jsonl")
    dev = [row for name in record["dev"] for row in read_jsonl(tmp_path / "a" / "dev" / f"{name}.jsonl")]
    assert len(train) == 100 and len(dev) == 152
    assert not {r["id"] for r in train} & {r["id"] for r in dev}
    assert not {r["question"].lower() for r in train} & {r["question"].lower() for r in dev}
    assert all(gold_evidence(row["metadata"]) for row in train + dev)  # evidence recall needs gold passages
    assert {row["dataset"] for row in dev} == {"hotpotqa", "2wikimultihopqa", "musique", "nq"}
    # a smaller train side is a prefix of a larger one (a study grows without redoing its traces)
    smaller = split_questions(realdata, tmp_path / "c", dev=38, train=10, seed=0)
    assert all(ids == record["train"][name][:10] for name, ids in smaller["train"].items())
    with pytest.raises(MapsTrainError, match="fewer than the 400 and 25 asked for"):
        split_questions(realdata, tmp_path / "d", dev=400, train=25, seed=0)


def test_the_report_compares_the_base_and_the_baseline_with_every_system(tmp_path):
    assert study_pairs(["vanilla_rag", "maps_base", "maps_sft", "maps_rl", "extra"], "maps_base", "vanilla_rag",
                       ["maps_rl"]) == [
        ("maps_base", "maps_sft"), ("maps_base", "maps_rl"), ("maps_base", "extra"), ("vanilla_rag", "maps_base"),
        ("vanilla_rag", "maps_sft"), ("vanilla_rag", "maps_rl"), ("vanilla_rag", "extra"), ("maps_sft", "maps_rl"),
        ("extra", "maps_rl")]
    # the base and the baseline are named, not inferred: any names work
    assert study_pairs(["b0", "s1"], "b0", "none") == [("b0", "s1")]
    recalls = (("vanilla_rag", 0.5), ("maps_base", 0.25), ("maps_sft", 0.75), ("extra", 0.5), ("teacher", 1.0))
    rows = [{"system": system, "dataset": "d", "question_id": str(i), "evidence_recall": recall, "em": 0.0,
             "f1": 0.0, "cover_em": 0.0, "rounds": 1, "cost": {"retrievals": 1}}
            for system, recall in recalls for i in range(3)]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = write_study_report(results, tmp_path, {"traces": 61.0}, systems=["vanilla_rag", "maps_base", "maps_sft",
                                "extra"], base="maps_base", baseline="vanilla_rag", dropped=["maps_rl"],
                                split_digest="ab12").read_text()
    assert "sha256 `ab12`" in report and "Not evaluated: maps_rl" in report
    assert "| maps_base -> maps_sft | Evidence recall, retrieved | 3 | 25.0 | 75.0 | +50.0 | [+50.0, +50.0] | yes |" in report
    assert "| vanilla_rag -> maps_sft | Evidence recall, retrieved | 3 | 50.0 | 75.0 | +25.0 |" in report
    assert "| maps_base -> extra | Evidence recall, retrieved | 3 | 25.0 | 50.0 | +25.0 |" in report
    assert "| extra | 3 |" in report and "| teacher | 3 |" in report
    # transfer towards the teacher: (0.75 - 0.25) / (1.0 - 0.25) = 2/3; EM's gap is 0: undefined
    assert "| maps_sft | Evidence recall, retrieved | 3 | 25.0 | 100.0 | 75.0 | +0.67 | [+0.67, +0.67] | 0 |" in report
    assert "| extra | EM | 3 | 0.0 | 0.0 | 0.0 | - | - | 10000 |" in report
    assert "### Transfer, d" in report
    assert "| traces | 61 |" in report
    with pytest.raises(MapsTrainError, match="no results of maps_rl"):
        write_study_report(results, tmp_path, {}, systems=["maps_base", "maps_rl"], base="maps_base",
                           baseline="vanilla_rag")
