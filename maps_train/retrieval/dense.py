"""Dense search over an index directory: one encoder batch and one FAISS call per `search` batch."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from maps_train.retrieval.base import Hit
from maps_train.retrieval.corpus import Corpus
from maps_train.retrieval.encoders import Encoder
from maps_train.retrieval.manifest import check_manifest, read_manifest


class DenseRetriever:
    """Load an index built by `build_dense_index`; `search(queries, k)` returns up to k hits per query."""

    def __init__(
        self,
        index_dir: str | Path,
        corpus: str | Path | None = None,
        encoder: str | Encoder | None = None,
        *,
        device: str | None = None,
        fp16: bool = True,
        batch_size: int = 64,
        nprobe: int | None = None,
        ef_search: int | None = None,
        use_gpu: bool | None = None,
        mmap: bool = False,
    ):
        """`corpus` / `encoder` (a name or a loaded Encoder): what the caller expects; a mismatch is an error.

        The corpus defaults to the manifest's path. `mmap=True` maps a flat index from disk instead of reading it
        into memory (a 21M x 768 flat index is 64 GB).
        """
        import faiss

        from maps_train.retrieval.faiss_index import gpu_count, set_search_params, to_gpus

        self.index_dir = Path(index_dir)
        self.manifest = read_manifest(self.index_dir)
        encoder_name = encoder.name if isinstance(encoder, Encoder) else encoder
        corpus_path = corpus or self.manifest["corpus"]["path"]
        check_manifest(self.manifest, self.index_dir, corpus=corpus_path, encoder=encoder_name, kind="dense")
        self.corpus = Corpus(corpus_path)
        recorded = self.manifest["encoder"]
        if isinstance(encoder, Encoder):
            self.encoder = encoder
        else:
            self.encoder = Encoder(
                recorded["name"],
                device=device,
                fp16=fp16,
                batch_size=batch_size,
                query_prefix=recorded["query_prefix"],
                passage_prefix=recorded["passage_prefix"],
            )
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        index = faiss.read_index(str(self.index_dir / self.manifest["index"]["file"]), flags)
        set_search_params(index, nprobe=nprobe, ef_search=ef_search)
        self.index = to_gpus(index) if (gpu_count() > 0 if use_gpu is None else use_gpu) else index
        # FAISS GPU indexes and the torch encoder are not safe to call from several threads at once
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.corpus)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encoder.encode_queries(queries)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(int(k), len(self.corpus)))
        with self._lock:
            vectors = self.encoder.encode_queries(queries)
            scores, rows = self.index.search(vectors, k)
        return [self._hits(row_ids, row_scores) for row_ids, row_scores in zip(rows, scores)]

    def _hits(self, rows: np.ndarray, scores: np.ndarray) -> list[Hit]:
        hits = []
        for row, score in zip(rows.tolist(), scores.tolist()):
            if row < 0:  # FAISS pads with -1 when an approximate index finds fewer than k
                continue
            passage = self.corpus[row]
            hits.append(Hit(passage.id, passage.title, passage.text, float(score)))
        return hits
