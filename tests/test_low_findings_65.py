"""Issue 65's low findings, one line each: an absurd machine size in `plan`, RL settings this run never uses or
that cannot work (a role's reward for a role not trained, `rl.decisions: both` without the consolidator, a zero
save interval, a completion longer than the context), and `analyze queries` saying it keeps one of k samples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from maps_train.analysis.queries import read_searches
from maps_train.errors import ConfigError
from maps_train.recipe import load_recipe
from maps_train.rl.checks import check_completion_fits, check_grpo_numbers, rl_warnings


def test_plan_refuses_a_memory_size_that_overflows_in_one_line(repo_root):
    done = subprocess.run([sys.executable, "-m", "maps_train.cli", "plan", "recipes/study/learning.yaml",
                           "--gpu-memory-gb", "1e308"], capture_output=True, text=True, cwd=repo_root)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("maps-train: error: --gpu-memory-gb: must be a number of gigabytes > 0 and at "
                                   "most 1,000,000,000, got 1e+308")


def test_rl_settings_this_run_never_uses_are_said():
    recipe = load_recipe("recipes/study/learning.yaml", ["rl.roles=[writer]", "rl.decisions=both"])
    # learning.yaml prices the consolidator's rounds; fixing its decisions both ways: neither acts on the writer
    assert rl_warnings(recipe) == [
        "rl.role_reward.consolidator: rl.roles (writer) does not train consolidator; its reward applies only to a "
        "run that does",
        "rl.decisions: 'both' fixes the consolidator's stop-or-continue, and rl.roles (writer) does not train the "
        "consolidator: it changes nothing in this run"]
    assert rl_warnings(load_recipe("recipes/study/learning.yaml")) == []


def test_rl_numbers_that_cannot_work_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^rl.grpo.save_steps: must be an integer >= 1 .* got 0$"):
        check_grpo_numbers({"save_steps": 0})
    check_grpo_numbers({"save_steps": 1})
    check_grpo_numbers({"save_steps": 0.25})
    recipe = load_recipe("recipes/study/learning.yaml", ["rl.max_completion_tokens=100000"])
    with pytest.raises(ConfigError, match=r"^rl.max_completion_tokens: 100000 does not fit the context with a "
                                          r"prompt \(backend.max_model_len: 4096\)"):
        check_completion_fits(recipe)
    check_completion_fits(load_recipe("recipes/study/learning.yaml"))


def test_analyze_queries_says_it_keeps_one_sample_a_question(tmp_path, capsys):
    from maps_train.records.credit import compute_credit
    from maps_train.records.evidence import gold_evidence
    from maps_train.records.trace import RoundRecord, SubQueryHits, TraceRecord

    gold = gold_evidence({"supporting_paragraphs": [{"title": "A", "text": "A is here.", "corpus_id": "p1"}]})

    def trace(found: list[str]) -> str:
        record = TraceRecord(question_id="q1", question="Where is A?", dataset="toy", method="maps",
                             config_digest="d", rounds=[RoundRecord(index=1, directions=["a"], sub_queries=["a"],
                                                                    retrieved=[SubQueryHits("a", found)])],
                             stop_reason="sufficient", final_call=None, final_answer="here", golden_answers=["here"])
        record.credit = compute_credit(record, gold)
        return json.dumps(record.to_dict()) + "\n"

    for k, found in enumerate((["p1"], ["p9"], ["p9"])):  # three samples of one question; the first found the gold
        folder = tmp_path / "traces" / "run" / f"sample-{k}"
        folder.mkdir(parents=True)
        (folder / "traces.jsonl").write_text(trace(found))
    searches, _ = read_searches(tmp_path / "traces")
    assert len(searches) == 1 and searches[("toy", "q1")].found == frozenset({0})  # the first sample's
    assert "2 more traces of questions already read (several samples a question); each question counts once, by " \
           "its first trace" in capsys.readouterr().err
