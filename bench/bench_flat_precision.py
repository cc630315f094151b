"""A flat index searched in host memory in fp32 or in fp16, as `retrieval.flat_precision` chooses (issue 47):

- fp32: FAISS IndexFlatIP (what `index.faiss` holds): scored by BLAS matrix products,
- fp16: FAISS IndexScalarQuantizer QT_fp16 filled from the fp16 memmap: half the memory, no BLAS.

    .venv/bin/python bench/bench_flat_precision.py [--passages 200000] [--dim 768] [--queries 256] [--k 10]
        [--threads 1 2]

Both hold the same values (the fp16 embeddings, widened for fp32), so their top-k agree; the table gives
queries/s (best of 3 batched searches) for each FAISS thread count, the index's bytes, and the top-1 agreement.
Random unit vectors (no model needed). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from maps_train.retrieval.faiss_index import flat_fp16_index


def best_rate(index, queries: np.ndarray, k: int, repeats: int = 3) -> tuple[float, np.ndarray]:
    best, rows = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        _, rows = index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best, rows


def main() -> None:
    import faiss

    parser = argparse.ArgumentParser()
    parser.add_argument("--passages", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.passages, args.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embeddings = vectors.astype(np.float16)
    del vectors
    queries = rng.standard_normal((args.queries, args.dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    fp32 = faiss.IndexFlatIP(args.dim)
    for start in range(0, args.passages, 65_536):
        fp32.add(embeddings[start : start + 65_536].astype(np.float32))
    fp16 = flat_fp16_index(embeddings, 65_536)

    print(f"{args.passages:,} passages x {args.dim}, {args.queries} queries, top {args.k}")
    print(f"{'index':<6} {'bytes':>10} " + " ".join(f"{f'{t} thread q/s':>14}" for t in args.threads))
    rates, tops = {}, {}
    for name, index, size in (("fp32", fp32, args.passages * args.dim * 4),
                              ("fp16", fp16, args.passages * args.dim * 2)):
        rates[name] = []
        for threads in args.threads:
            faiss.omp_set_num_threads(threads)
            rate, rows = best_rate(index, queries, args.k)
            rates[name].append(rate)
            tops[name] = rows[:, 0]
        print(f"{name:<6} {size / 1e9:>8.2f} GB " + " ".join(f"{rate:>14.1f}" for rate in rates[name]))
    speedups = " ".join(f"{a / b:.1f}x" for a, b in zip(rates["fp32"], rates["fp16"]))
    print(f"fp32 / fp16 queries/s: {speedups}; top-1 agreement {np.mean(tops['fp32'] == tops['fp16']):.3f}")


if __name__ == "__main__":
    main()
