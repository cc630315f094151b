"""Retrieval on real components: MiniLM embeddings, FAISS, bm25s, uvicorn; small slices of the real corpus.

Passages are the first 200 of ../shared/realdata's corpus cut to 30 words, so embedding them takes seconds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
from fixtures_retrieval import CHUNK, PASSAGES, QUERIES  # noqa: F401  (the index fixtures: conftest)

from maps_train.errors import MapsTrainError
from maps_train.platform import free_port
from maps_train.recipe import RetrievalConfig
from maps_train.retrieval import Hit
from maps_train.retrieval.build import EMBEDDINGS, INDEX_FILE, PROGRESS, build_dense_index
from maps_train.retrieval.corpus import Corpus

# ---- corpus readers ----


def test_flashrag_rows_by_offset(short_corpus, realdata):
    corpus = Corpus(short_corpus)
    assert len(corpus) == PASSAGES
    first = json.loads(short_corpus.read_text().splitlines()[0])
    assert corpus[0].id == first["id"] and corpus[0].contents == first["contents"]
    last = json.loads(short_corpus.read_text().splitlines()[-1])
    assert corpus[PASSAGES - 1].id == last["id"]
    # the real corpus has both `title` and `contents`: the title is not repeated in the text
    real = Corpus(realdata / "corpus" / "corpus.jsonl")
    assert len(real) == 31593
    passage = real[5]
    assert passage.title and not passage.text.startswith(passage.title + "\n")
    assert real[31592].id == json.loads((realdata / "corpus" / "corpus.jsonl").read_text().splitlines()[-1])["id"]


def test_title_text_jsonl_and_blank_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 1, "title": "A", "text": "alpha"}\n\n{"id": "b", "contents": "\\"B\\"\\nbeta"}\n')
    corpus = Corpus(path)
    assert len(corpus) == 2
    assert (corpus[0].id, corpus[0].title, corpus[0].text) == ("1", "A", "alpha")
    assert (corpus[1].title, corpus[1].text) == ("B", "beta")


def test_malformed_lines_name_file_and_line(tmp_path, encoder, settings):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "contents": "A\\nx"}\n\n{"id": "b", "contents": "B\\ny"}\n{"id": "c", "contents": \n')
    corpus = Corpus(path)
    with pytest.raises(MapsTrainError, match=rf"^{path}:4: invalid JSON"):
        corpus[2]
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": "a", "contents": "A\\nx"}\n{"contents": "B\\ny"}\n')
    with pytest.raises(MapsTrainError, match=rf"^{missing}:2: missing field 'id'"):
        Corpus(missing)[1]
    # a build stops at the bad line, before embedding anything
    with pytest.raises(MapsTrainError, match=rf"{path}:4:") as err:
        build_dense_index(path, tmp_path / "idx", settings, encoder=encoder, show_progress=False)
    assert "\n" not in str(err.value)


def test_dpr_tsv(tmp_path):
    path = tmp_path / "psgs.tsv"
    path.write_text(
        'id\ttext\ttitle\n1\t"Aaron is a prophet ""high priest"" of Israel"\tAaron\n2\tplain text\tTitle Two\n'
    )
    corpus = Corpus(path)
    assert corpus.format == "dpr_tsv" and len(corpus) == 2  # header skipped
    assert (corpus[0].id, corpus[0].title, corpus[0].text) == (
        "1",
        "Aaron",
        'Aaron is a prophet "high priest" of Israel',
    )
    assert corpus[1].contents == "Title Two\nplain text"
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\ttext\ttitle\n1\tfine\tT\n2\tonly two fields\n")
    with pytest.raises(MapsTrainError, match=rf"^{bad}:3: expected 3 tab-separated fields"):
        Corpus(bad)[1]


# ---- dense index ----


def test_search_matches_brute_force(dense, dense_dir, encoder, short_corpus):
    embeddings = np.load(dense_dir / EMBEDDINGS).astype(np.float32)
    corpus = Corpus(short_corpus)
    # the memmap holds each row's own passage embedding, in corpus order
    rows = [0, 63, 64, 199]
    fresh = encoder.encode_passages([corpus[r].contents for r in rows])
    np.testing.assert_allclose(embeddings[rows], fresh, atol=2e-3)
    results = dense.search(QUERIES, k=5)
    expected = encoder.encode_queries(QUERIES) @ embeddings.T
    for hits, scores in zip(results, expected):
        order = np.argsort(-scores)[:5]
        assert [hit.id for hit in hits] == [corpus[int(r)].id for r in order]
        np.testing.assert_allclose([hit.score for hit in hits], scores[order], rtol=1e-4, atol=1e-5)
    # a passage's own text finds it first
    own = dense.search([corpus[17].contents], k=1)[0][0]
    assert isinstance(own, Hit) and own.id == corpus[17].id and own.title == corpus[17].title


def test_manifest_records_the_build(dense_dir, short_corpus):
    manifest = json.loads((dense_dir / "manifest.json").read_text())
    assert manifest["kind"] == "dense" and manifest["count"] == PASSAGES and manifest["dimension"] == 384
    assert manifest["corpus"]["path"] == str(short_corpus.resolve())
    assert manifest["encoder"] == {
        "name": "builtin:minilm-l6",
        "query_prefix": "",
        "passage_prefix": "",
        "normalized": True,
        "fp16": False,
    }
    assert manifest["index"]["type"] == "flat" and manifest["index"]["metric"] == "inner_product"


def test_resume_after_interruption_equals_uninterrupted(short_corpus, encoder, settings, dense_dir, tmp_path):
    out = tmp_path / "resumed"

    def stop_after_chunk_one(chunk: int) -> None:
        if chunk == 1:
            raise KeyboardInterrupt  # what Ctrl-C does between chunks

    with pytest.raises(KeyboardInterrupt):
        build_dense_index(
            short_corpus, out, settings, encoder=encoder, after_chunk=stop_after_chunk_one, show_progress=False
        )
    assert json.loads((out / PROGRESS).read_text())["chunks_done"] == [0, 1]
    assert not (out / "manifest.json").exists()
    with pytest.raises(MapsTrainError, match="partial build with different chunk_size"):  # never mix two plans
        build_dense_index(short_corpus, out, replace(settings, chunk_size=32), encoder=encoder, show_progress=False)
    encoded_on_resume: list[int] = []
    build_dense_index(
        short_corpus, out, settings, encoder=encoder, after_chunk=encoded_on_resume.append, show_progress=False
    )
    assert encoded_on_resume == [2, 3]  # finished chunks were not embedded again
    assert np.array_equal(np.load(out / EMBEDDINGS), np.load(dense_dir / EMBEDDINGS))
    assert (out / INDEX_FILE).read_bytes() == (dense_dir / INDEX_FILE).read_bytes()


def test_manifest_mismatch_is_one_line_error(dense_dir, short_corpus, tmp_path):
    from maps_train.retrieval.dense import DenseRetriever

    with pytest.raises(MapsTrainError, match="built with encoder 'builtin:minilm-l6', not 'intfloat/e5-base-v2'"):
        DenseRetriever(dense_dir, encoder="intfloat/e5-base-v2")
    other = tmp_path / "other.jsonl"
    other.write_text(short_corpus.read_text().replace("a", "b", 1))
    with pytest.raises(MapsTrainError, match=r"index was built from corpus .* which differs from") as err:
        DenseRetriever(dense_dir, corpus=other)
    assert "\n" not in str(err.value)


def test_hnsw_and_ivfpq_from_the_memmap(dense_dir, dense, encoder):
    import faiss

    from maps_train.retrieval.faiss_index import build_from_memmap

    embeddings = np.load(dense_dir / EMBEDDINGS, mmap_mode="r")
    params = {"hnsw_m": 16, "hnsw_ef_construction": 100, "ivf_nlist": 16, "pq_m": 48}
    hnsw, used = build_from_memmap(embeddings, "hnsw", params, chunk_rows=50, use_gpu=False)
    assert isinstance(hnsw, faiss.IndexHNSWFlat) and hnsw.ntotal == PASSAGES and used["M"] == 16
    _, approx = hnsw.search(encoder.encode_queries(QUERIES), 1)
    exact = [hits[0].id for hits in dense.search(QUERIES, 1)]
    assert sum(dense.corpus[int(row)].id == gold for row, gold in zip(approx[:, 0], exact)) >= len(QUERIES) - 1
    with pytest.raises(MapsTrainError, match="ivfpq needs at least"):
        build_from_memmap(embeddings, "ivfpq", params, chunk_rows=50, use_gpu=False)


# ---- BM25 ----


def test_bm25_returns_the_obvious_passage(bm25, short_corpus):
    corpus = Corpus(short_corpus)
    results = bm25.search(["Jeff Porcaro drummer Toto", corpus[42].title, "zzqx qqzv"], k=3)
    assert results[0][0].title == "Jeff Porcaro"
    assert results[1][0].id == corpus[42].id
    assert results[2] == []  # no query term is in the corpus: no hits rather than arbitrary ones
    assert all(a.score >= b.score for a, b in zip(results[0], results[0][1:]))


# ---- factory, CLI ----


def test_build_retriever_builds_missing_default_index(short_corpus, tmp_path, caplog, monkeypatch):
    from maps_train.retrieval.bm25 import BM25Retriever
    from maps_train.retrieval.client import RetrievalClient
    from maps_train.retrieval.factory import build_retriever, default_index_dir

    monkeypatch.setenv("MAPS_TRAIN_HOME", str(tmp_path / "home"))  # default indexes live under it
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(short_corpus.read_bytes())
    cfg = RetrievalConfig(corpus=str(corpus), kind="bm25")
    with caplog.at_level(logging.WARNING, logger="maps_train.retrieval.factory"):
        retriever = build_retriever(cfg)
    assert isinstance(retriever, BM25Retriever)
    index_dir = default_index_dir(cfg)
    assert index_dir.is_relative_to(tmp_path / "home" / "indexes") and index_dir.name == "index-bm25"
    assert (index_dir / "manifest.json").exists()
    assert any("building it" in record.message for record in caplog.records)
    assert build_retriever(cfg).search(["Jeff Porcaro"], 1)[0][0].title == "Jeff Porcaro"  # reused, not rebuilt
    assert isinstance(build_retriever(RetrievalConfig(service_url="http://127.0.0.1:9")), RetrievalClient)


def test_cli_build_and_search(short_corpus, tmp_path):
    from typer.testing import CliRunner

    from maps_train.cli import app

    out = tmp_path / "bm25"
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--corpus", str(short_corpus), "--kind", "bm25", "--out", str(out)])
    assert built.exit_code == 0, built.output
    found = runner.invoke(app, ["retrieve", "search", "Jeff Porcaro", "--index", str(out), "-k", "2"])
    assert found.exit_code == 0 and "Jeff Porcaro" in found.output.splitlines()[1]


# ---- the HTTP service ----


def test_service_under_concurrent_clients_matches_in_process(dense):
    import uvicorn

    from maps_train.retrieval.client import RetrievalClient
    from maps_train.retrieval.service import create_app

    requests = [([QUERIES[i % len(QUERIES)], QUERIES[(i * 3 + 1) % len(QUERIES)]], 1 + i % 5) for i in range(48)]
    expected = dense.search(QUERIES, k=5)
    by_query = dict(zip(QUERIES, expected))

    # Merging without a timing window: 16 clients of 2 queries each and a batch of exactly 32 queries, so a batch
    # closes when all 16 wait on it (each client sends its next request only once answered): 3 searches of 32.
    # The long max_wait only bounds a failure; no machine is too slow for it to decide the outcome.
    clients, per_request = 16, 2
    port = free_port()
    app = create_app(dense, max_batch=clients * per_request, max_wait_ms=60_000)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the retrieval service did not start"
            time.sleep(0.05)
        client = RetrievalClient(f"http://127.0.0.1:{port}", timeout_s=120)
        with ThreadPoolExecutor(max_workers=clients) as pool:
            answers = list(pool.map(lambda request: client.search(*request), requests))
        for (queries, k), hits_per_query in zip(requests, answers):
            for query, hits in zip(queries, hits_per_query):
                assert [hit.id for hit in hits] == [hit.id for hit in by_query[query][:k]]
                np.testing.assert_allclose(
                    [h.score for h in hits], [h.score for h in by_query[query][:k]], rtol=1e-4, atol=1e-5
                )
        stats = client.health()["stats"]
        assert stats["requests"] == len(requests)
        # concurrent requests were merged into shared searches, all full
        assert stats["search_calls"] == len(requests) // clients and stats["largest_batch"] == clients * per_request
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    with pytest.raises(MapsTrainError, match=f"retrieval service http://127.0.0.1:{port} unreachable"):
        RetrievalClient(f"http://127.0.0.1:{port}", retries=0).search(["anything"], 1)
