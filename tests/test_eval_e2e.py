"""A suite end to end with the real agent runner: the tiny Qwen3 through the hf backend, BM25 over the real
paragraphs of the sampled HotpotQA questions, MAPS and Vanilla RAG, scored, reported and resumed.

The tiny model has random weights, so its answers are noise and Cover-EM is near zero: this checks the wiring
(the runner contract, real token counts flowing into cost and compute, resume), not accuracy.
"""

from __future__ import annotations

import json

import pytest
import yaml
from test_cover_em_flashrag import flashrag_acc

from maps_train.evaluate.cost import count_parameters
from maps_train.evaluate.results import read_results
from maps_train.evaluate.suite import load_suite, load_suite_questions, run_suite

SAMPLE = 3


@pytest.mark.slow
def test_suite_with_the_real_agent_runner(tmp_path, realdata, tiny_qwen3):
    suite_path = tmp_path / "suite.yaml"
    recipe_path = tmp_path / "recipe.yaml"
    suite_path.write_text(
        yaml.safe_dump({
            "name": "e2e",
            "out_dir": str(tmp_path / "out"),
            "data_root": str(realdata),
            "datasets": [{"name": "hotpotqa", "sample": SAMPLE, "seed": 0}],
            "systems": [
                {"name": "maps", "recipe": str(recipe_path), "overrides": ["agent.method=maps"]},
                {"name": "vanilla_rag", "recipe": str(recipe_path), "overrides": ["agent.method=vanilla"]},
            ],
        })
    )
    # The corpus: every paragraph (supporting and distractor) of the sampled questions.
    suite = load_suite(suite_path)
    questions = load_suite_questions(suite, suite.datasets, suite_path)["hotpotqa"]
    with (tmp_path / "corpus.jsonl").open("w") as handle:
        seen = set()
        for question in questions:
            for paragraph in question.metadata["paragraphs"]:
                if paragraph["corpus_id"] not in seen:
                    seen.add(paragraph["corpus_id"])
                    contents = f"{paragraph['title']}\n{paragraph['text']}"
                    handle.write(json.dumps({"id": paragraph["corpus_id"], "title": paragraph["title"], "contents": contents}) + "\n")
    recipe_path.write_text(
        yaml.safe_dump({
            "name": "eval-e2e",
            "retrieval": {"corpus": str(tmp_path / "corpus.jsonl"), "kind": "bm25"},
            "backend": {"dtype": "float32", "max_model_len": 4096, "hf_batch_size": 16},
            "roles": {"default": {"backend": "hf", "model": tiny_qwen3, "max_tokens": 16}},
            "agent": {"num_directions": 2, "max_rounds": 2, "top_k": 3, "batch_size": 4},
        })
    )

    outcome = run_suite(suite_path, progress=False)
    assert outcome.scored == 2 * SAMPLE and outcome.unanswered == 0
    rows = read_results(outcome.results_path)
    assert {(r["system"], r["question_id"]) for r in rows} == {(s, q.id) for s in ("maps", "vanilla_rag") for q in questions}
    # The parameter count read from safetensors headers equals the loaded model's (tied embeddings counted once).
    from transformers import AutoModelForCausalLM

    params = count_parameters(tiny_qwen3)
    assert params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_qwen3).parameters())
    for row in rows:
        cost = row["cost"]
        assert row["method"] == ("maps" if row["system"] == "maps" else "vanilla")
        assert cost["calls"] >= 1 and cost["prompt_tokens"] > 0 and cost["retrievals"] >= 1
        assert cost["prompt_tokens"] == sum(r["prompt_tokens"] for r in cost["by_role"].values())
        assert row["compute_flops"] == pytest.approx(2 * params * (cost["prompt_tokens"] + cost["completion_tokens"]))
        assert row["answer_words"] == len(row["answer"].split())
    # Cover-EM of each row and of each cell is FlashRAG's (tests/test_cover_em_flashrag.py) on the run's own
    # answers.jsonl and the questions' golds, not the score the suite wrote.
    golds = {q.id: q.golden_answers for q in questions}
    for system in ("maps", "vanilla_rag"):
        answers = (tmp_path / "out" / "runs" / system / "hotpotqa" / "answers.jsonl").read_text().splitlines()
        scored = [json.loads(line) for line in answers]
        expected = {a["question_id"]: flashrag_acc(a["answer"], golds[a["question_id"]]) for a in scored}
        assert {r["question_id"]: r["cover_em"] for r in rows if r["system"] == system} == expected
        assert outcome.summary["cells"][system]["Avg"]["cover_em"] == pytest.approx(sum(expected.values()) / SAMPLE)
    maps_rows = [r for r in rows if r["system"] == "maps"]
    assert all(1 <= r["rounds"] <= 2 and {"proposer", "writer", "consolidator"} <= set(r["cost"]["by_role"]) for r in maps_rows)
    summary = outcome.summary
    assert summary["cells"]["maps"]["Avg"]["calls"] > summary["cells"]["vanilla_rag"]["Avg"]["calls"]
    assert all(path.is_file() for path in outcome.files.all())
    for system in ("maps", "vanilla_rag"):
        answers = (tmp_path / "out" / "runs" / system / "hotpotqa" / "answers.jsonl").read_text().splitlines()
        assert len(answers) == SAMPLE

    # Resume: nothing left to do, nothing re-run, nothing duplicated.
    again = run_suite(suite_path, progress=False)
    assert again.scored == 0 and len(read_results(outcome.results_path)) == 2 * SAMPLE
