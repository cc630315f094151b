"""The demo world: deterministic, self-consistent (answers in their passages, one passage per fact), committed."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from maps_train.questions import load_questions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "data" / "demo"))  # the generator lives beside its data
from demo_world import SPLIT_COUNTS, build_demo_world, write_demo_world  # noqa: E402


@pytest.fixture(scope="module")
def world():
    return build_demo_world()


@pytest.fixture(scope="module")
def passages(world):
    return {row["id"]: row for row in world["corpus"]}


def _questions(world):
    return world["train"] + world["test"]


def test_deterministic_and_committed(tmp_path, repo_root, world):
    first, second = tmp_path / "a", tmp_path / "b"
    write_demo_world(first)
    write_demo_world(second)
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        generated = (first / name).read_bytes()
        assert generated == (second / name).read_bytes()
        # The committed files are exactly what the generator writes (regenerate with python data/demo/demo_world.py).
        assert generated == (repo_root / "data" / "demo" / name).read_bytes(), f"data/demo/{name} is stale"
    assert build_demo_world(seed=1)["corpus"] != world["corpus"]


def test_sizes_and_formats(world, repo_root):
    assert 200 <= len(world["corpus"]) <= 400
    assert len({p["id"] for p in world["corpus"]}) == len({p["title"] for p in world["corpus"]}) == len(world["corpus"])
    for p in world["corpus"]:
        title, _, text = p["contents"].partition("\n")
        assert title == p["title"] and 40 <= len(text.split()) <= 100
    for split, counts in SPLIT_COUNTS.items():
        kinds = Counter(
            "comparison"
            if r["metadata"]["type"] == "comparison"
            else "single"
            if r["metadata"]["hops"] == 1
            else f"bridge{r['metadata']['hops']}"
            for r in world[split]
        )
        assert kinds == Counter(counts)
    train = load_questions(repo_root / "data" / "demo" / "train.jsonl")
    assert len(train) == 120 and train[0].metadata["supporting_paragraphs"]
    assert not {r["question"] for r in world["train"]} & {r["question"] for r in world["test"]}


def test_supporting_passages_exist_and_hold_the_answer(world, passages):
    for row in _questions(world):
        support = row["metadata"]["supporting_paragraphs"]
        assert len(support) == row["metadata"]["hops"] == len(row["metadata"]["decomposition"])
        for para in support:
            assert para["corpus_id"] in passages and passages[para["corpus_id"]]["title"] == para["title"]
        answer = row["golden_answers"][0]
        assert any(answer in passages[p["corpus_id"]]["contents"] for p in support), row["id"]


def test_bridge_hops_chain(world, passages):
    for row in _questions(world):
        meta = row["metadata"]
        if meta["type"] != "bridge":
            continue
        assert meta["decomposition_answers"][-1] == row["golden_answers"][0]
        for i, answer in enumerate(meta["decomposition_answers"][:-1]):
            # The answer of hop i is what hop i+1's passage is about: it appears there (title or text).
            assert answer in passages[meta["supporting_paragraphs"][i + 1]["corpus_id"]]["contents"], row["id"]
            assert f"#{i + 1}" in meta["decomposition"][i + 1]


def test_each_fact_stated_in_exactly_one_passage(world):
    # Hop i asks a fact about the entity its passage is titled with; exactly one passage names both.
    for row in _questions(world):
        meta = row["metadata"]
        for para, value in zip(meta["supporting_paragraphs"], meta["decomposition_answers"]):
            holders = [p["id"] for p in world["corpus"] if para["title"] in p["contents"] and value in p["contents"]]
            assert holders == [para["corpus_id"]], (row["id"], para["title"], value)


def test_comparisons_are_between_look_alikes(world, passages):
    for row in _questions(world):
        meta = row["metadata"]
        if meta["type"] != "comparison":
            continue
        a, b = (p["title"] for p in meta["supporting_paragraphs"])
        assert row["golden_answers"][0] in (a, b)
        years = [int(y) for y in meta["decomposition_answers"]]
        assert years[0] != years[1] and row["golden_answers"][0] == (a if years[0] < years[1] else b)
        # Same family, name root or band pattern: a lexical near-miss for the retriever.
        shared = set(a.lower().split()) & set(b.lower().split()) or a[:4] == b[:4]
        assert shared, (a, b)


def test_multi_hop_needs_more_than_one_retrieval(world, minilm):
    """Real MiniLM over the corpus: the question finds its first passage, rarely the last; the sub-question does."""
    from maps_train.analysis.embed import TextEncoder

    encoder = TextEncoder(minilm)
    corpus = world["corpus"]
    passage_vectors = encoder.encode([p["contents"] for p in corpus], kind="passage")
    ids = np.array([p["id"] for p in corpus])

    def top5(texts):
        return [set(ids[np.argsort(-scores)[:5]]) for scores in encoder.encode(texts) @ passage_vectors.T]

    bridges = [r for r in _questions(world) if r["metadata"]["type"] == "bridge"]
    found = top5([r["question"] for r in bridges])
    first = np.mean([r["metadata"]["supporting_paragraphs"][0]["corpus_id"] in f for r, f in zip(bridges, found)])
    last = np.mean([r["metadata"]["supporting_paragraphs"][-1]["corpus_id"] in f for r, f in zip(bridges, found)])
    # The final hop's sub-question with the earlier answer filled in, as an agent would write it.
    resolved = []
    for r in bridges:
        text = r["metadata"]["decomposition"][-1]
        for i, answer in enumerate(r["metadata"]["decomposition_answers"]):
            text = text.replace(f"#{i + 1}", answer)
        resolved.append(text)
    last_resolved = np.mean(
        [r["metadata"]["supporting_paragraphs"][-1]["corpus_id"] in f for r, f in zip(bridges, top5(resolved))]
    )
    assert first >= 0.9 and last <= 0.3 and last_resolved >= 0.7, (first, last, last_resolved)


def test_readme_describes_the_files(repo_root):
    readme = (repo_root / "data" / "demo" / "README.md").read_text()
    assert "python data/demo/demo_world.py data/demo" in readme and "supporting_paragraphs" in readme
    rows = [json.loads(line) for line in (repo_root / "data" / "demo" / "test.jsonl").open()]
    assert len(rows) == 40
