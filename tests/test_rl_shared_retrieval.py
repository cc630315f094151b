"""Issue 47: GRPO ranks on one machine share one retrieval service instead of loading an index each (wiki-18: 7
ranks x 32-65 GB). The machine's first rank starts `maps-train retrieve serve` and writes its URL; every rank
searches through it; one rank searches in process as before. The demo world's index (MiniLM, 258 passages).
Issue 63: the URL file is written whole, names its owner, is removed at the owner's exit, and a stale one (left by
a launch that died) is never read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.retrieval.client import RetrievalClient
from maps_train.retrieval.factory import build_retriever
from maps_train.rl.shared_retrieval import forget_url, live_url, rank_retriever, url_file, write_url

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
        url = live_url(url_file(recipe))
        assert url.startswith("http://127.0.0.1:")
        assert json.loads(url_file(recipe).read_text(encoding="utf-8"))["pid"] == os.getpid()
        assert [p.name for p in url_file(recipe).parent.iterdir()] == [url_file(recipe).name]  # no partial file
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


def test_a_stale_url_file_is_never_read(recipe, monkeypatch):
    """A URL file left by a launch whose first rank died (here: a finished process's pid, a live pid that started
    at another time, i.e. a reused one, and the old plain-text format) is waited past, never read: the rank gives
    up with one line instead of searching a dead URL."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    path = url_file(recipe)
    path.parent.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for stale in ({"url": "http://127.0.0.1:9", "pid": int(gone), "started": 1.0},
                  {"url": "http://127.0.0.1:9", "pid": os.getpid(), "started": 1.0}):
        path.write_text(json.dumps(stale), encoding="utf-8")
        assert live_url(path) is None
        with pytest.raises(MapsTrainError, match=r"^rl: no live retrieval service URL in .* after 1 s"):
            rank_retriever(recipe, timeout_s=1.0)
    path.write_text("http://127.0.0.1:9\n", encoding="utf-8")  # the format before issue 63
    assert live_url(path) is None
    write_url(path, "http://127.0.0.1:8")  # this process's own: live
    assert live_url(path) == "http://127.0.0.1:8"
    second, none = rank_retriever(recipe, timeout_s=1.0)
    assert none is None and second.url == "http://127.0.0.1:8"


def test_the_url_file_is_removed_when_its_owner_exits(recipe):
    """The rank that wrote the file removes it at exit (atexit), and only its own: another launch's stays."""
    path = url_file(recipe)
    script = ("import sys, atexit; from pathlib import Path; "
              "from maps_train.rl.shared_retrieval import write_url, forget_url, live_url; "
              "p = Path(sys.argv[1]); write_url(p, 'http://127.0.0.1:7'); atexit.register(forget_url, p); "
              "assert live_url(p) == 'http://127.0.0.1:7'")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, cwd=REPO)
    assert path.parent.is_dir() and not path.exists()
    write_url(path, "http://127.0.0.1:6")
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from maps_train.rl.shared_retrieval import forget_url; forget_url(Path(sys.argv[1]))",
                            str(path)], cwd=REPO)
    assert other.returncode == 0 and live_url(path) == "http://127.0.0.1:6"  # not its file: kept
    forget_url(path)
    assert not path.exists()
