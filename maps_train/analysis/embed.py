"""Texts to unit vectors with a sentence-transformers encoder, with the per-model query/passage prefixes.

E5 models are trained with `query: ` and `passage: ` prefixes, MiniLM with none (the registry in
`maps_train.retrieval.encoders` is the one source). The default analysis encoder is E5-base-v2
(`DEFAULT_ENCODER`); any name `resolve_model` accepts works. Each distinct text is embedded once.
"""

from __future__ import annotations

import numpy as np

from maps_train.analysis.sequences import SubquerySequence

DEFAULT_ENCODER = "intfloat/e5-base-v2"


def default_prefixes(model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) the model was trained with: the retrieval stage's registry decides."""
    from maps_train.retrieval.encoders import prefixes_for

    prefixes = prefixes_for(model)
    return prefixes.query, prefixes.passage


class TextEncoder:
    """A sentence-transformers model that embeds each distinct text once and returns unit vectors."""

    def __init__(
        self,
        model: str = DEFAULT_ENCODER,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        batch_size: int = 64,
        device: str | None = None,
        show_progress: bool = False,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        from maps_train.models import resolve_model

        self.name = model
        default_query, default_passage = default_prefixes(model)
        self.query_prefix = default_query if query_prefix is None else query_prefix
        self.passage_prefix = default_passage if passage_prefix is None else passage_prefix
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.model = SentenceTransformer(resolve_model(model), device=device)
        self._cache: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str], kind: str = "query") -> np.ndarray:
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        keys = [prefix + text for text in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if missing:
            vectors = self.model.encode(
                missing,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=self.show_progress,
            )
            self._cache.update(zip(missing, vectors.astype(np.float64)))
        if not keys:
            dimension = getattr(self.model, "get_embedding_dimension", self.model.get_sentence_embedding_dimension)
            return np.zeros((0, dimension() or 0))
        return np.stack([self._cache[k] for k in keys])


def embed_sequences(
    sequences: list[SubquerySequence], encoder: TextEncoder
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """(q_0 per sequence, per sequence the (n_queries, dim) embeddings of each round)."""
    # One batched call for every question and sub-query: far faster than per-sequence calls.
    texts = [s.question for s in sequences] + [q for s in sequences for r in s.rounds for q in r]
    encoder.encode(texts, kind="query")
    questions = [encoder.encode([s.question])[0] for s in sequences]
    rounds = [[encoder.encode(r) for r in s.rounds] for s in sequences]
    return questions, rounds


def embed_evidence(sequences: list[SubquerySequence], encoder: TextEncoder) -> list[np.ndarray]:
    """Per sequence the (n_passages, dim) embeddings of its gold passages (empty when unknown)."""
    encoder.encode([p for s in sequences for p in s.evidence], kind="passage")
    return [encoder.encode(s.evidence, kind="passage") for s in sequences]
