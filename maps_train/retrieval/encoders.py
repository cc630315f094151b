"""Dense encoders: sentence-transformers models with the query/passage prefixes each family was trained with.

E5 was trained with `query: ` / `passage: `, BGE (v1.5, English) with an instruction before queries only, MiniLM
with none; using the wrong prefix silently costs recall, so the prefixes are looked up here and recorded in every
index manifest. Embeddings are L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class Prefixes:
    query: str = ""
    passage: str = ""


# (substring of the lower-cased model name, prefixes); the first match wins, so specific names come first.
PREFIX_REGISTRY: tuple[tuple[str, Prefixes], ...] = (
    ("bge-m3", Prefixes()),  # BGE-M3 needs no instruction
    (
        "e5-mistral",
        Prefixes("Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: ", ""),
    ),
    ("e5", Prefixes("query: ", "passage: ")),
    ("bge", Prefixes(BGE_QUERY_INSTRUCTION, "")),
    ("minilm", Prefixes()),
    ("mpnet", Prefixes()),
    ("contriever", Prefixes()),
)


def prefixes_for(name: str, query_prefix: str | None = None, passage_prefix: str | None = None) -> Prefixes:
    """The registry's prefixes for a model name; explicit arguments (e.g. from the recipe) win."""
    lowered = name.lower()
    found = next((prefixes for pattern, prefixes in PREFIX_REGISTRY if pattern in lowered), None)
    if found is None:
        logger.warning("encoder %s is not in the prefix registry; using no query/passage prefix", name)
        found = Prefixes()
    return Prefixes(
        found.query if query_prefix is None else query_prefix,
        found.passage if passage_prefix is None else passage_prefix,
    )


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """A sentence-transformers model plus its prefixes; `encode_*` return float32, L2-normalised rows."""

    def __init__(
        self,
        name: str,
        device: str | None = None,
        fp16: bool = True,
        batch_size: int = 64,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
    ):
        from sentence_transformers import SentenceTransformer

        from maps_train.models import resolve_model

        self.name = name
        self.prefixes = prefixes_for(name, query_prefix, passage_prefix)
        self.device = device or default_device()
        self.batch_size = batch_size
        self.model = SentenceTransformer(resolve_model(name), device=self.device)
        # fp16 halves memory and doubles throughput on GPU; on CPU it is slower and less exact, so it stays fp32
        self.fp16 = bool(fp16 and self.device.startswith("cuda"))
        if self.fp16:
            self.model.half()
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dimension())

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int | None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            prompt=prefix or None,
            batch_size=batch_size or self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        return self._encode(queries, self.prefixes.query, batch_size)

    def encode_passages(self, passages: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        return self._encode(passages, self.prefixes.passage, batch_size)
