"""Names that reach W&B are unique: two different labels never map to one artifact name (a path's separators and
any character W&B refuses are replaced, so the label's own hash goes with them); plain names stay as written."""

from __future__ import annotations

from pathlib import Path

from maps_train.tracking import ARTIFACT_NAME_LIMIT, artifact_name


def test_paths_that_differ_only_in_replaced_characters_get_different_names():
    labels = [Path("runs/a/b"), Path("runs/a-b"), Path("runs/a b"), Path("runs/a_b"), "runs/a/b/", "runs/a//b"]
    names = [artifact_name("traces", label) for label in labels]
    assert len(set(names[:4])) == 4, names
    assert names[0] == names[4] == names[5]  # one folder written three ways is still one name


def test_plain_names_are_kept_and_long_ones_stay_within_the_limit():
    assert artifact_name("adapter", "student-a-shared") == "adapter-student-a-shared"
    long_a, long_b = "x/" * 100 + "a", "x-" * 100 + "a"
    assert artifact_name("sft", long_a) != artifact_name("sft", long_b)
    assert max(len(artifact_name("sft", long_a)), len(artifact_name("sft", long_b))) <= ARTIFACT_NAME_LIMIT
