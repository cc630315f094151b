"""Issue 47: GRPO ranks on one machine share one retrieval service instead of loading an index each (wiki-18: 7
ranks x 32-65 GB). The machine's first rank starts `maps-train retrieve serve` and writes its URL; every rank
searches through it; one rank searches in process as before. The demo world's index (MiniLM, 258 passages)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maps_train.recipe import load_recipe
from maps_train.retrieval.client import RetrievalClient
from maps_train.retrieval.factory import build_retriever
from maps_train.rl.shared_retrieval import rank_retriever, url_file

REPO = Path(__file__).resolve().parents[1]
QUERIES = ["Which river flows through the capital?", "Who founded the company?"]


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MASTER_PORT", "29611")
    return load_recipe("recipes/demo/rl.yaml", [f"rl.output_dir={tmp_path / 'rl'}"])


def test_the_ranks_of_a_machine_search_one_service_started_by_the_first(recipe, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    first, service = rank_retriever(recipe, timeout_s=300)
    try:
        assert isinstance(first, RetrievalClient) and service is not None and service.poll() is None
        url = url_file(recipe).read_text(encoding="utf-8").strip()
        assert url.startswith("http://127.0.0.1:")
        monkeypatch.setenv("LOCAL_RANK", "1")
        second, none = rank_retriever(recipe, timeout_s=30)
        assert none is None and isinstance(second, RetrievalClient)
        in_process = build_retriever(recipe.retrieval)
        expected = [[hit.id for hit in hits] for hits in in_process.search(QUERIES, 3)]
        for client in (first, second):
            assert [[hit.id for hit in hits] for hits in client.search(QUERIES, 3)] == expected
    finally:
        service.terminate()
        service.wait(timeout=60)


def test_one_rank_searches_in_process(recipe, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    retriever, service = rank_retriever(recipe)
    assert service is None and not isinstance(retriever, RetrievalClient)
    assert not url_file(recipe).exists()
