"""`--shard I/N`: which questions a shard runs, and merging shard folders back with no duplicate (the merged run
equals the unsharded one). Runs go through `run_method` with the scripted backend (tests/scripted_backend.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents import run_method
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.shards import Shard, in_shard_folder, merge_shards


def questions(n):
    return [Question(id=f"q{i}", question=f"question {i}?", golden_answers=[f"a{i}"], dataset="toy") for i in range(n)]


def run(out, items, *overrides):
    recipe = load_recipe(None, ["agent.max_rounds=3", "agent.num_directions=2", *overrides])
    backend = ScriptedBackend({"consolidator": consolidator_sufficient_after({"q1": 1, "q4": 2})})
    return run_method(recipe, items, out, backend=backend, retriever=RecordingRetriever(), progress=False)


def rows(path):
    return {row["question_id"]: row for row in map(json.loads, path.read_text().splitlines())}


def without_wall_clock(row):
    """Latencies are the only fields that differ between two runs of the same questions."""
    text = json.dumps(row, sort_keys=True)
    return json.loads(text, object_hook=lambda d: {k: v for k, v in d.items() if not k.endswith("latency_s")})


def test_shard_spec_parses_and_bad_ones_are_one_line():
    assert Shard.parse("2/4") == Shard(2, 4) and Shard.parse(None) is None
    for bad in ("0/2", "3/2", "2", "a/b"):
        with pytest.raises(MapsTrainError, match="--shard: expected I/N"):
            Shard.parse(bad)


def test_shards_partition_the_questions_whatever_their_order():
    items = questions(400)
    parts = [Shard(i, 4).select(items) for i in range(1, 5)]
    ids = Counter(q.id for part in parts for q in part)
    assert set(ids) == {q.id for q in items} and set(ids.values()) == {1}
    assert min(map(len, parts)) > 60  # a hash, not a prefix: every shard gets a fair share
    assert [q.id for q in Shard(3, 4).select(reversed(items))] == [q.id for q in reversed(parts[2])]


def test_merged_shards_equal_the_whole_run_and_merging_again_adds_nothing(tmp_path):
    items = questions(9)
    run(tmp_path / "whole", items)
    out = tmp_path / "sharded"
    for index in (1, 2, 3):
        shard = Shard(index, 3)
        run(shard.out_dir(out), shard.select(items))
    report = merge_shards(out)
    assert report.shards == ["1-of-3", "2-of-3", "3-of-3"] and not report.missing
    assert report.added == {str(out / "answers.jsonl"): 9}
    for name in ("answers.jsonl", "traces.jsonl"):
        merged, whole = rows(out / name), rows(tmp_path / "whole" / name)
        assert sorted(merged) == sorted(whole)
        assert {k: without_wall_clock(v) for k, v in merged.items()} == {
            k: without_wall_clock(v) for k, v in whole.items()
        }
    again = merge_shards(out)
    assert again.added == {} and again.skipped == 9
    assert len((out / "answers.jsonl").read_text().splitlines()) == 9
    # The merged folder is a finished run: resuming it runs nothing.
    assert len(run(out, items)) == 9


def test_a_missing_shard_is_reported_and_a_trace_without_its_answer_stays_out(tmp_path):
    items = questions(20)
    shard = Shard(1, 2)
    folder = shard.out_dir(tmp_path)
    run(folder, shard.select(items))
    answers = (folder / "answers.jsonl").read_text().splitlines(keepends=True)
    (folder / "answers.jsonl").write_text("".join(answers[:-1]))  # killed between its last trace and answer
    report = merge_shards(tmp_path)
    assert report.missing == ["2-of-2"]
    merged = rows(tmp_path / "answers.jsonl")
    assert len(merged) == len(answers) - 1 and set(rows(tmp_path / "traces.jsonl")) == set(merged)


def test_shards_of_another_configuration_are_refused(tmp_path):
    items = questions(6)
    run(Shard(1, 2).out_dir(tmp_path), Shard(1, 2).select(items))
    run(Shard(2, 2).out_dir(tmp_path), Shard(2, 2).select(items), "agent.num_directions=3")
    with pytest.raises(MapsTrainError, match="another configuration"):
        merge_shards(tmp_path)


def test_no_shards_is_a_one_line_error_and_whole_run_readers_skip_shard_folders(tmp_path):
    with pytest.raises(MapsTrainError, match="no shard folders"):
        merge_shards(tmp_path)
    assert in_shard_folder(tmp_path / "shards" / "1-of-2" / "x" / "traces.jsonl", tmp_path)
    assert not in_shard_folder(tmp_path / "x" / "shards" / "traces.jsonl", tmp_path)
