"""Texts to unit vectors with a sentence-transformers encoder, with the per-model query/passage prefixes.

E5 models are trained with `query: ` and `passage: ` prefixes, MiniLM with none (the registry in
`maps_train.retrieval.encoders` is the one source). The default analysis encoder is E5-base-v2
(`DEFAULT_ENCODER`); any name `resolve_model` accepts works. Each distinct text is embedded once.
"""

from __future__ import annotations

import numpy as np

from maps_train.analysis.sequences import SubquerySequence

DEFAULT_ENCODER = "intfloat/e5-base-v2"


class TextEncoder:
    """The retrieval stage's `Encoder` (same model loading, same prefixes) with a cache: each distinct text is
    embedded once, and vectors come back as float64 for the fitting code."""

    def __init__(
        self,
        model: str = DEFAULT_ENCODER,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        batch_size: int = 64,
        device: str | None = None,
    ) -> None:
        from maps_train.retrieval.encoders import Encoder

        # fp32 even on GPU: the analyses compare cosines to four decimals.
        self.encoder = Encoder(model, device=device, fp16=False, batch_size=batch_size,
                               query_prefix=query_prefix, passage_prefix=passage_prefix)
        self.name = model
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    def encode(self, texts: list[str], kind: str = "query") -> np.ndarray:
        keys = [(kind, text) for text in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if missing:
            texts_missing = [text for _, text in missing]
            encode = self.encoder.encode_queries if kind == "query" else self.encoder.encode_passages
            self._cache.update(zip(missing, encode(texts_missing).astype(np.float64)))
        if not keys:
            return np.zeros((0, self.encoder.dim))
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
