"""`maps-train index build`: embed a corpus in resumable chunks into a memory-mapped matrix, then index it.

Layout of an index directory:
- `build.json`     the settings of the build in progress (a rerun with other settings is refused, not mixed in)
- `embeddings.npy` n x d float16/float32, written chunk by chunk through a memory map (np.load(mmap_mode="r"))
- `progress.json`  finished chunk numbers, rewritten atomically after each chunk is flushed to disk
- `index.faiss`    the FAISS index (inner product on normalised vectors), or bm25/ for BM25
- `manifest.json`  written last: corpus path + fingerprint, encoder + prefixes, dimension, count, index type, params

Kill a build and rerun the same command: finished chunks are skipped, and since every chunk is encoded from the
same rows in the same batches, the result equals an uninterrupted build.

Before anything is embedded or tokenised, every row of the corpus is read once and a repeated passage id stops the
build with one line naming the id and both lines (`corpus.require_unique_ids`; an error, not a dedupe, see
`maps_train.retrieval.corpus`). That pass costs a few minutes on the 21M-passage DPR corpus.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from maps_train.errors import MapsTrainError
from maps_train.recipe import RetrievalConfig
from maps_train.retrieval.corpus import FINGERPRINT_METHOD, Corpus, require_unique_ids
from maps_train.retrieval.encoders import Encoder
from maps_train.retrieval.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    check_manifest,
    has_manifest,
    read_manifest,
    write_json_atomic,
)

logger = logging.getLogger(__name__)

EMBEDDINGS = "embeddings.npy"
PROGRESS = "progress.json"
BUILD_INPUTS = "build.json"  # what a partial build was built from: a resumed one must match it
INDEX_FILE = "index.faiss"


def build_index(settings: RetrievalConfig, out_dir: str | Path, force: bool = False, **kwargs: Any) -> Path:
    """Build the index `settings.kind` asks for over `settings.corpus` into `out_dir`."""
    if settings.kind == "bm25":
        from maps_train.retrieval.bm25 import build_bm25_index

        if force or not has_manifest(Path(out_dir)):  # a finished index is reused, and was checked when built
            corpus = Corpus(settings.corpus)
            try:
                require_unique_ids(corpus)
            finally:
                corpus.close()
        return build_bm25_index(settings.corpus, out_dir, force=force)
    return build_dense_index(settings.corpus, out_dir, settings, force=force, **kwargs)


def _corpus_record(corpus: Corpus) -> dict[str, Any]:
    return {
        "path": str(corpus.path),
        "format": corpus.format,
        "checksum": corpus.fingerprint,
        "checksum_method": FINGERPRINT_METHOD,
        "count": len(corpus),
    }


def _build_inputs(corpus: Corpus, encoder: Encoder, settings: RetrievalConfig) -> dict[str, Any]:
    """What the embeddings depend on: the corpus, the encoder and its prefixes, the chunking and the dtype."""
    return {
        "corpus_checksum": corpus.fingerprint,
        "count": len(corpus),
        "encoder": settings.encoder,
        "query_prefix": encoder.prefixes.query,
        "passage_prefix": encoder.prefixes.passage,
        "dim": encoder.dim,
        "chunk_size": settings.chunk_size,
        "encode_batch_size": settings.encode_batch_size,
        "embedding_dtype": settings.embedding_dtype,
        "encoder_fp16": encoder.fp16,
    }


def _start_or_resume(out: Path, inputs: dict[str, Any]) -> set[int]:
    """The chunks already finished by an earlier run from the same inputs."""
    inputs_path = out / BUILD_INPUTS
    if inputs_path.is_file():
        previous = json.loads(inputs_path.read_text(encoding="utf-8"))
        changed = [key for key in inputs if previous.get(key) != inputs[key]]
        if changed:
            raise MapsTrainError(
                f"{inputs_path}: a partial build with different {changed[0]} ({previous.get(changed[0])!r} vs "
                f"{inputs[changed[0]]!r}) is in this directory; delete it or choose another --out"
            )
        progress_path = out / PROGRESS
        if progress_path.is_file() and (out / EMBEDDINGS).is_file():
            return set(json.loads(progress_path.read_text(encoding="utf-8"))["chunks_done"])
        return set()
    write_json_atomic(inputs_path, inputs)
    return set()


def build_dense_index(
    corpus_path: str | Path,
    out_dir: str | Path,
    settings: RetrievalConfig | None = None,
    *,
    encoder: Encoder | None = None,
    force: bool = False,
    keep_embeddings: bool = True,
    use_gpu: bool | None = None,
    after_chunk: Callable[[int], None] | None = None,
    show_progress: bool = True,
) -> Path:
    """Embed `corpus_path` with `settings.encoder` and build a `settings.index_type` index in `out_dir`.

    `encoder` reuses an already loaded Encoder (it must be `settings.encoder`). `after_chunk(chunk_number)` runs
    after each chunk is durable (tests use it to interrupt a build). Returns `out_dir`.
    """
    from tqdm import tqdm

    from maps_train.retrieval.faiss_index import build_from_memmap, gpu_count

    settings = replace(settings or RetrievalConfig(), corpus=str(corpus_path))
    out = Path(out_dir)
    if has_manifest(out) and not force:
        # a finished index is reused only if it is exactly what was asked for; otherwise say what differs
        manifest = read_manifest(out)
        check_manifest(manifest, out, corpus=corpus_path, encoder=settings.encoder, kind="dense")
        if manifest["index"]["type"] != settings.index_type:
            raise MapsTrainError(
                f"{out}: holds a finished {manifest['index']['type']} index, not {settings.index_type}; "
                f"use --force or another --out"
            )
        logger.info("index %s is already built; pass force=True (--force) to rebuild", out)
        return out
    if force:
        for name in (MANIFEST, BUILD_INPUTS, PROGRESS, EMBEDDINGS, INDEX_FILE):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    corpus = Corpus(corpus_path)
    count = len(corpus)
    if count == 0:
        raise MapsTrainError(f"{corpus_path}: the corpus has no passages")
    require_unique_ids(corpus)
    if encoder is None:
        encoder = Encoder(
            settings.encoder,
            fp16=settings.fp16,
            batch_size=settings.encode_batch_size,
            query_prefix=settings.query_prefix,
            passage_prefix=settings.passage_prefix,
        )
    elif encoder.name != settings.encoder:
        raise MapsTrainError(f"encoder object is '{encoder.name}' but settings.encoder is '{settings.encoder}'")
    inputs = _build_inputs(corpus, encoder, settings)
    done = _start_or_resume(out, inputs)

    # ---- embed, chunk by chunk, into the memory map ----
    dtype = np.float16 if settings.embedding_dtype == "float16" else np.float32
    mode = "r+" if done else "w+"
    embeddings = np.lib.format.open_memmap(out / EMBEDDINGS, mode=mode, dtype=dtype, shape=(count, encoder.dim))
    chunk_size = settings.chunk_size
    chunks = math.ceil(count / chunk_size)
    remaining = [c for c in range(chunks) if c not in done]
    rows_done = count - sum(min(chunk_size, count - c * chunk_size) for c in remaining)
    if done:
        logger.info("resuming %s: %d of %d chunks already embedded", out, len(done), chunks)
    bar = tqdm(total=count, initial=rows_done, unit="passage", desc="embedding", disable=not show_progress)
    encode_seconds = 0.0
    for chunk in remaining:
        start, stop = chunk * chunk_size, min((chunk + 1) * chunk_size, count)
        texts = [passage.contents for passage in corpus.iter_rows(start, stop)]
        tick = time.perf_counter()
        embeddings[start:stop] = encoder.encode_passages(texts, batch_size=settings.encode_batch_size)
        encode_seconds += time.perf_counter() - tick
        embeddings.flush()
        done.add(chunk)
        write_json_atomic(out / PROGRESS, {"chunks_done": sorted(done), "chunks": chunks})
        bar.update(stop - start)
        if after_chunk is not None:
            after_chunk(chunk)
    bar.close()
    del embeddings

    # ---- index the memory map, a chunk of rows at a time ----
    embeddings = np.load(out / EMBEDDINGS, mmap_mode="r")
    gpu = gpu_count() > 0 if use_gpu is None else use_gpu
    params = {
        "hnsw_m": settings.hnsw_m,
        "hnsw_ef_construction": settings.hnsw_ef_construction,
        "ivf_nlist": settings.ivf_nlist,
        "pq_m": settings.pq_m,
    }
    bar = tqdm(total=count, unit="vector", desc=f"indexing ({settings.index_type})", disable=not show_progress)
    import faiss

    index, used = build_from_memmap(embeddings, settings.index_type, params, chunk_size, gpu, bar.update)
    bar.close()
    faiss.write_index(index, str(out / INDEX_FILE))
    del index, embeddings
    if not keep_embeddings:
        (out / EMBEDDINGS).unlink()

    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": "dense",
        "corpus": _corpus_record(corpus),
        "encoder": {
            "name": settings.encoder,
            "query_prefix": encoder.prefixes.query,
            "passage_prefix": encoder.prefixes.passage,
            "normalized": True,
            "fp16": encoder.fp16,
        },
        "dimension": encoder.dim,
        "count": count,
        "index": {"type": settings.index_type, "metric": "inner_product", "file": INDEX_FILE, "params": used},
        "embeddings": {"file": EMBEDDINGS if keep_embeddings else None, "dtype": settings.embedding_dtype},
        "build": {
            "chunk_size": chunk_size,
            "encode_batch_size": settings.encode_batch_size,
            "faiss_gpu": bool(gpu and settings.index_type == "ivfpq"),
            "seconds_this_run": round(time.perf_counter() - started, 2),
            "encode_seconds_this_run": round(encode_seconds, 2),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(out / MANIFEST, manifest)
    corpus.close()
    logger.info("built %s index of %d passages in %s", settings.index_type, count, out)
    return out
