"""Retrieval fixtures shared by every test module that searches (a pytest plugin, registered in conftest): one
MiniLM + FAISS index and one BM25 index per test session over the first passages of ../shared/realdata's corpus,
cut to 30 words, so embedding them takes seconds. Fixtures imported into a module instead would be built once per
importing module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maps_train.recipe import RetrievalConfig
from maps_train.retrieval.build import build_dense_index

PASSAGES = 200
CHUNK = 64  # 200 passages -> chunks of 64, 64, 64, 8
QUERIES = [
    "Who was the drummer of the band Toto?",
    "Neil Peart",
    "an American record producer and songwriter",
    "capital city of a European country",
    "football club founded in England",
    "a novel published in the 19th century",
    "river flowing through a valley",
    "television series broadcast on a network",
]


@pytest.fixture(scope="session")
def short_corpus(realdata, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with (realdata / "corpus" / "corpus.jsonl").open(encoding="utf-8") as source, path.open("w") as sink:
        for _, line in zip(range(PASSAGES), source):
            row = json.loads(line)
            title, _, text = row["contents"].partition("\n")
            sink.write(json.dumps({"id": row["id"], "contents": title + "\n" + " ".join(text.split()[:30])}) + "\n")
    return path


@pytest.fixture(scope="session")
def encoder(minilm):
    from maps_train.retrieval.encoders import Encoder

    return Encoder("builtin:minilm-l6", batch_size=32)


@pytest.fixture(scope="session")
def settings() -> RetrievalConfig:
    return RetrievalConfig(chunk_size=CHUNK, encode_batch_size=32)


@pytest.fixture(scope="session")
def dense_dir(short_corpus, encoder, settings, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dense") / "index"
    return build_dense_index(short_corpus, out, settings, encoder=encoder, show_progress=False)


@pytest.fixture(scope="session")
def dense(dense_dir, encoder):
    from maps_train.retrieval.dense import DenseRetriever

    return DenseRetriever(dense_dir, encoder=encoder)


@pytest.fixture(scope="session")
def bm25(short_corpus, tmp_path_factory):
    from maps_train.retrieval.bm25 import BM25Retriever, build_bm25_index

    out = build_bm25_index(short_corpus, tmp_path_factory.mktemp("bm25") / "index", show_progress=False)
    return BM25Retriever(out)
