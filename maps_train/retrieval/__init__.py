"""Retrieval: corpus readers, encoders, FAISS/BM25 indexes, batched search and the retrieval service.

Everything that searches implements `Retriever.search(queries, k) -> list[list[Hit]]` (one list per query),
so agents never know whether the index is in process, BM25, or behind an HTTP service. Get one with
`build_retriever(recipe.retrieval)`.

Modules: corpus (readers + offset index), encoders (sentence-transformers + prefixes), build (resumable index
build), faiss_index, manifest, dense, bm25, service (HTTP, dynamic batching), client, factory, recall, cli.
"""

from maps_train.retrieval.base import Hit, Retriever

# Heavy modules (torch, faiss, fastapi) load on first use, so `import maps_train.retrieval` stays cheap.
_LAZY = {
    "build_retriever": "maps_train.retrieval.factory",
    "load_retriever": "maps_train.retrieval.factory",
    "default_index_dir": "maps_train.retrieval.factory",
    "build_index": "maps_train.retrieval.build",
    "build_dense_index": "maps_train.retrieval.build",
    "build_bm25_index": "maps_train.retrieval.bm25",
    "DenseRetriever": "maps_train.retrieval.dense",
    "BM25Retriever": "maps_train.retrieval.bm25",
    "RetrievalClient": "maps_train.retrieval.client",
    "Encoder": "maps_train.retrieval.encoders",
    "Corpus": "maps_train.retrieval.corpus",
    "Passage": "maps_train.retrieval.corpus",
}

__all__ = ["Hit", "Retriever"] + list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'maps_train.retrieval' has no attribute '{name}'")
