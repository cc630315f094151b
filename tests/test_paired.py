"""Paired bootstrap intervals between two systems on the same questions, checked against cases worked by hand."""

from __future__ import annotations

import pytest

from maps_train.errors import MapsTrainError
from maps_train.evaluate.paired import compare, comparison_table, paired_bootstrap, paired_rows


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
