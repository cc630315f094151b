"""Retrieval: corpus readers, encoders, FAISS/BM25 indexes, batched search and the retrieval service.

Everything that searches implements `Retriever.search(queries, k) -> list[list[Hit]]` (one list per query),
so agents never know whether the index is in process, BM25, or behind an HTTP service.
"""

from maps_train.retrieval.base import Hit, Retriever

__all__ = ["Hit", "Retriever"]
