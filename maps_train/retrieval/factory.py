"""`build_retriever(cfg)`: the one call agents, the demo and the evaluator make to get a `Retriever`.

- `cfg.service_url` set: a `RetrievalClient` for a running `maps-train retrieve serve`.
- otherwise an in-process `DenseRetriever` or `BM25Retriever` over `cfg.index_dir`, or over the default directory
  derived from corpus + encoder (`default_index_dir`); a missing index is built first (logged), under a file
  lock so concurrent processes build it once.

`RetrieverPool`: one retriever per distinct retrieval config, shared by every run of a suite (a 21M-passage index
is loaded once, not once per system x data set).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path

from maps_train.config.yaml_io import to_dict
from maps_train.errors import MapsTrainError
from maps_train.recipe import RetrievalConfig
from maps_train.retrieval.base import Retriever
from maps_train.retrieval.manifest import has_manifest, read_manifest

logger = logging.getLogger(__name__)


def slug(encoder: str) -> str:
    name = encoder.removeprefix("builtin:")
    if Path(name).expanduser().exists():
        name = Path(name).expanduser().resolve().name
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-")


def default_index_dir(cfg: RetrievalConfig) -> Path:
    """`$MAPS_TRAIN_HOME/indexes/<corpus stem>-<fingerprint>/index-<encoder>-<type>` (or `.../index-bm25`).

    Keyed by the corpus fingerprint so two corpora never share an index, and outside the corpus folder, which may
    be read-only shared data or a source tree. Real runs set `retrieval.index_dir` explicitly.
    """
    from maps_train.paths import home
    from maps_train.retrieval.corpus import fingerprint

    corpus = Path(cfg.corpus).expanduser()
    if not corpus.is_file():
        raise MapsTrainError(f"{cfg.corpus}: no such corpus file (retrieval.corpus)")
    name = "index-bm25" if cfg.kind == "bm25" else f"index-{slug(cfg.encoder)}-{cfg.index_type}"
    return home() / "indexes" / f"{corpus.stem}-{fingerprint(corpus)[-12:]}" / name


def load_retriever(index_dir: str | Path, corpus: str | Path | None = None, encoder=None, **kwargs):
    """The in-process retriever for a finished index directory, dense or BM25 as its manifest says."""
    kind = read_manifest(index_dir)["kind"]
    if kind == "bm25":
        from maps_train.retrieval.bm25 import BM25Retriever

        return BM25Retriever(index_dir, corpus=corpus)
    from maps_train.retrieval.dense import DenseRetriever

    return DenseRetriever(index_dir, corpus=corpus, encoder=encoder, **kwargs)


def build_retriever(cfg: RetrievalConfig) -> Retriever:
    if cfg.service_url:
        from maps_train.retrieval.client import RetrievalClient

        return RetrievalClient(cfg.service_url, timeout_s=cfg.service_timeout_s)
    index_dir, encoder = ensure_index(cfg)
    if cfg.kind == "bm25":
        from maps_train.retrieval.bm25 import BM25Retriever

        return BM25Retriever(index_dir, corpus=cfg.corpus)
    from maps_train.retrieval.dense import DenseRetriever

    return DenseRetriever(
        index_dir,
        corpus=cfg.corpus,
        encoder=encoder or cfg.encoder,
        fp16=cfg.fp16,
        batch_size=cfg.encode_batch_size,
        nprobe=cfg.nprobe,
        ef_search=cfg.hnsw_ef_search,
        flat_precision=cfg.flat_precision,
        threads=cfg.search_threads,
    )


def ensure_index(cfg: RetrievalConfig):
    """The index directory of `cfg` (`retrieval.index_dir`, else `default_index_dir`), built first when missing
    and `auto_build` allows it (under a file lock: concurrent processes build it once); and the encoder the build
    loaded, if it did (None otherwise)."""
    index_dir = Path(cfg.index_dir).expanduser() if cfg.index_dir else default_index_dir(cfg)
    encoder = None
    if not has_manifest(index_dir):
        if not cfg.auto_build:
            raise MapsTrainError(f"{index_dir}: no index (retrieval.index_dir); run `maps-train index build`")
        from filelock import FileLock

        from maps_train.retrieval.build import build_index

        index_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(index_dir) + ".lock"):
            if not has_manifest(index_dir):  # another process may have built it while we waited
                logger.warning("no %s index at %s: building it from %s now", cfg.kind, index_dir, cfg.corpus)
                if cfg.kind == "dense":
                    from maps_train.retrieval.encoders import Encoder

                    encoder = Encoder(
                        cfg.encoder,
                        fp16=cfg.fp16,
                        batch_size=cfg.encode_batch_size,
                        query_prefix=cfg.query_prefix,
                        passage_prefix=cfg.passage_prefix,
                    )
                build_index(cfg, index_dir, **({"encoder": encoder} if encoder is not None else {}))
    return index_dir, encoder


def retriever_key(cfg: RetrievalConfig) -> str:
    """What makes two retrieval configs load different retrievers. top_k is not part of what is loaded (each
    search passes its k): systems differing only there share one."""
    return json.dumps({**to_dict(cfg), "top_k": None}, sort_keys=True)


class RetrieverPool:
    """`get(cfg)`: the retriever of `cfg`, built on first use and shared afterwards (a retriever's `search` is
    safe from several threads: the dense and BM25 retrievers search under a lock, the HTTP client pools httpx).
    Callers on several threads asking for one config wait for one build."""

    def __init__(self) -> None:
        self._retrievers: dict[str, Retriever] = {}
        self._lock = threading.Lock()

    def get(self, cfg: RetrievalConfig) -> Retriever:
        key = retriever_key(cfg)
        with self._lock:  # held through the build: a second build of one config would load the index twice
            if key not in self._retrievers:
                self._retrievers[key] = build_retriever(cfg)
            return self._retrievers[key]

    def __len__(self) -> int:
        return len(self._retrievers)

    def close(self) -> None:
        """Drop every retriever (and with it its index) now, not whenever the pool itself is collected."""
        with self._lock:
            for retriever in self._retrievers.values():
                close = getattr(retriever, "close", None)
                if close is not None:  # the HTTP client's connection pool
                    close()
            self._retrievers.clear()
