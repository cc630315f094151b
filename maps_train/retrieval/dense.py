"""Dense search over an index directory: one encoder batch and one FAISS call per `search` batch."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from maps_train.retrieval.base import Hit
from maps_train.retrieval.corpus import Corpus
from maps_train.retrieval.encoders import Encoder
from maps_train.retrieval.manifest import check_manifest, read_manifest

logger = logging.getLogger(__name__)


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
        flat_precision: str = "auto",
        threads: int | None = None,
    ):
        """`corpus` / `encoder` (a name or a loaded Encoder): what the caller expects; a mismatch is an error.

        The corpus defaults to the manifest's path. A flat index on GPUs is searched from the build's fp16
        embeddings; in host memory from the fp32 FAISS file where half the host's memory holds it, else from the
        fp16 embeddings (`flat_precision`: "auto", "fp32", "fp16"); `mmap=True` maps the FAISS file from disk
        instead of reading it. `threads`: FAISS's CPU search threads (`faiss_index.search_threads`).
        """
        import faiss

        from maps_train.retrieval import faiss_index
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
        on_gpu = gpu_count() > 0 if use_gpu is None else use_gpu
        if on_gpu and not gpu_count():
            logger.warning("retrieval on GPU asked for, but this FAISS sees no GPU: searching on CPU")
            on_gpu = False
        embeddings = self._fp16_embeddings()
        self.threads = faiss_index.search_threads(threads)
        if embeddings is not None and not on_gpu and self.manifest["index"]["type"] == "flat" and \
                faiss_index.flat_precision(*embeddings.shape, faiss_index.host_memory_bytes(), flat_precision) == "fp32":
            embeddings = None  # the host holds the fp32 index: read it, and search it through BLAS
        if self.manifest["index"]["type"] == "flat" and embeddings is not None:
            self.index, self.location = _flat_fp16(embeddings, on_gpu)
            self.storage = "flat fp16"
        else:  # hnsw/ivfpq, or a flat index whose fp16 embeddings were not kept: the FAISS file as written
            flags = faiss.IO_FLAG_MMAP if mmap else 0
            cpu_index = faiss.read_index(str(self.index_dir / self.manifest["index"]["file"]), flags)
            set_search_params(cpu_index, nprobe=nprobe, ef_search=ef_search)
            self.index = to_gpus(cpu_index) if on_gpu else cpu_index
            self.location = f"GPU x {gpu_count()}" if self.index is not cpu_index else "CPU"
            self.storage = {"flat": "flat fp32", "hnsw": "hnsw fp32", "ivfpq": "ivfpq"}[self.manifest["index"]["type"]]
        logger.info("index: %d passages, %s, on %s, %d search threads (%s)", self.index.ntotal, self.storage,
                    self.location, self.threads, self.index_dir)
        # FAISS GPU indexes and the torch encoder are not safe to call from several threads at once: one lock
        # makes a retriever shareable by every run of a suite
        self._lock = threading.Lock()

    def _fp16_embeddings(self) -> np.ndarray | None:
        """The build's fp16 embedding matrix, memory-mapped read-only; None if it was not kept or is fp32."""
        record = self.manifest.get("embeddings") or {}
        path = self.index_dir / record["file"] if record.get("file") else None
        if path is None or record.get("dtype") != "float16" or not path.is_file():
            return None
        return np.load(path, mmap_mode="r")

    def __len__(self) -> int:
        return len(self.corpus)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.encoder.encode_queries(queries)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(int(k), len(self.corpus)))
        import faiss

        with self._lock:
            vectors = self.encoder.encode_queries(queries)
            faiss.omp_set_num_threads(self.threads)  # per calling thread in OpenMP: set where the search runs
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


def _flat_fp16(embeddings: np.ndarray, on_gpu: bool) -> tuple[Any, str]:
    """The flat index over the fp16 embeddings and where it lives: split over every GPU, else in host memory.
    A GPU copy that fails is named in a WARNING, with the reason, before the CPU index is built."""
    from maps_train.retrieval.faiss_index import LOAD_CHUNK_ROWS, flat_fp16_index, flat_fp16_to_gpus, gpu_count

    if on_gpu:
        try:
            return flat_fp16_to_gpus(embeddings, LOAD_CHUNK_ROWS), f"GPU x {gpu_count()}"
        except Exception as err:  # out of GPU memory, or a FAISS build without GpuIndexFlat
            logger.warning("could not place the flat fp16 index (%d vectors) on %d GPUs (%s: %s); searching it "
                           "on CPU instead", len(embeddings), gpu_count(), type(err).__name__, err)
    return flat_fp16_index(embeddings, LOAD_CHUNK_ROWS), "CPU"
