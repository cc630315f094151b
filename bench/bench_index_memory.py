"""Memory and search time of a flat index held three ways, over a synthetic fp16 embeddings memmap (issue 35):

- fp32 IndexFlatIP (what `index.faiss` holds; what the retriever loaded before),
- FAISS IndexScalarQuantizer QT_fp16 filled from the memmap (what `DenseRetriever` loads now),
- a chunked numpy matmul straight over the memmap (no index in memory at all).

    .venv/bin/python bench/bench_index_memory.py [--passages 200000] [--dim 384] [--queries 64] [--k 10]

Memory is the process's anonymous resident memory (RssAnon: the memmap's own pages are file-backed, not counted)
after the index is loaded; search time is the best of 3 batched searches. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from maps_train.retrieval.faiss_index import build_from_memmap, flat_fp16_index

CHUNK_ROWS = 65_536


def anon_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def best_of(search, repeats: int = 3) -> tuple[float, tuple]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = search()
        times.append(time.perf_counter() - start)
    return min(times), result


def matmul_search(embeddings: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k inner product over the memmap, one fp32-widened chunk at a time."""
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_rows = np.full((len(queries), k), -1, dtype=np.int64)
    for start in range(0, len(embeddings), CHUNK_ROWS):
        scores = queries @ np.asarray(embeddings[start : start + CHUNK_ROWS], dtype=np.float32).T
        rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
        merged_scores = np.concatenate([best_scores, scores], axis=1)
        merged_rows = np.concatenate([best_rows, rows], axis=1)
        top = np.argpartition(-merged_scores, k - 1, axis=1)[:, :k]
        best_scores = np.take_along_axis(merged_scores, top, axis=1)
        best_rows = np.take_along_axis(merged_rows, top, axis=1)
    order = np.argsort(-best_scores, axis=1)
    return np.take_along_axis(best_scores, order, axis=1), np.take_along_axis(best_rows, order, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "embeddings.npy"
        writer = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(args.passages, args.dim))
        for start in range(0, args.passages, CHUNK_ROWS):
            block = rng.standard_normal((min(CHUNK_ROWS, args.passages - start), args.dim), dtype=np.float32)
            writer[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
        writer.flush()
        del writer
        embeddings = np.load(path, mmap_mode="r")
        queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        print(f"{args.passages:,} passages x {args.dim}, {args.queries} queries, k={args.k}; "
              f"fp16 matrix {args.passages * args.dim * 2 / 2**20:.0f} MiB, fp32 {args.passages * args.dim * 4 / 2**20:.0f} MiB")

        results = {}
        for name, load in (
            ("fp32 IndexFlatIP", lambda: build_from_memmap(embeddings, "flat", {}, CHUNK_ROWS, False)[0]),
            ("fp16 IndexScalarQuantizer", lambda: flat_fp16_index(embeddings, CHUNK_ROWS)),
        ):
            before = anon_rss_mb()
            index = load()
            held = anon_rss_mb() - before
            seconds, (scores, rows) = best_of(partial(index.search, queries, args.k))
            results[name] = (scores, rows)
            print(f"{name:28s} resident +{held:7.0f} MiB  search {seconds * 1000:8.1f} ms")
            del index
        before = anon_rss_mb()
        seconds, (scores, rows) = best_of(lambda: matmul_search(embeddings, queries, args.k))
        results["numpy matmul"] = (scores, rows)
        print(f"{'numpy chunked matmul':28s} resident +{anon_rss_mb() - before:7.0f} MiB  search {seconds * 1000:8.1f} ms")

        reference_scores, reference_rows = results["fp32 IndexFlatIP"]
        for name in ("fp16 IndexScalarQuantizer", "numpy matmul"):
            scores, rows = results[name]
            print(f"{name} vs fp32 flat: same top-{args.k} rows {np.array_equal(rows, reference_rows)}, "
                  f"max score difference {np.abs(scores - reference_scores).max():.2e}")


if __name__ == "__main__":
    main()
