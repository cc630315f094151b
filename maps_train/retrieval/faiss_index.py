"""FAISS index construction, filling from a memory-mapped embedding matrix, and GPU placement.

All indexes use inner product on L2-normalised vectors (= cosine). `flat` is exact; `hnsw` is a CPU graph index
(FAISS has no GPU HNSW); `ivfpq` compresses vectors (e.g. 768-d fp32 -> 64 bytes) for corpora that do not fit.

A flat index split over GPUs is searched from the build's fp16 embeddings (`flat_fp16_to_gpus`); in host memory
from the fp32 `index.faiss` where the host holds it (`flat_precision`: BLAS search, several times faster), else from
the fp16 embeddings (`flat_fp16_index`): 2 bytes per dimension instead of 4 (21M x 768: 32 GB, not 64.5 GB), and
the same top-k, since the fp32 index holds exactly those fp16 values widened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from maps_train.errors import MapsTrainError

logger = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "hnsw", "ivfpq")
LOAD_CHUNK_ROWS = 65_536  # rows copied (or widened to fp32 for a GPU) at a time while a flat index loads
IVFPQ_MIN_PASSAGES = 10_000  # below this, k-means and PQ training have too few points; flat is exact and small


# A flat index in host memory is searched in fp32 (IndexFlatIP: FAISS's BLAS path) where its fp32 vectors take at
# most this share of the host's memory, else in fp16 (IndexScalarQuantizer QT_fp16: half the memory, no BLAS;
# bench/bench_flat_precision.py measures both).
FLAT_FP32_HOST_SHARE = 0.5


def flat_precision(count: int, dim: int, host_bytes: float, asked: str = "auto") -> str:
    """"fp32" or "fp16" for a flat index of `count` x `dim` searched in a host of `host_bytes` (`asked`: the
    recipe's retrieval.flat_precision; "auto" decides by memory). The plan calls it with the stated host."""
    if asked in ("fp32", "fp16"):
        return asked
    return "fp32" if count * dim * 4 <= FLAT_FP32_HOST_SHARE * host_bytes else "fp16"


def host_memory_bytes() -> int:
    """This machine's physical memory."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def search_threads(asked: int | None = None) -> int:
    """FAISS's CPU search threads for this process: `asked`, else this machine's CPUs shared out over the ranks
    running on it (LOCAL_WORLD_SIZE, 1 outside a launch), at least one."""
    import os

    if asked:
        return max(1, int(asked))
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    return max(1, len(os.sched_getaffinity(0)) // ranks)


def gpu_count() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def to_gpus(index: Any, fp16: bool = True) -> Any:
    """Spread an index over every visible GPU (FAISS GPU build), or return it unchanged."""
    import faiss

    if gpu_count() == 0 or not hasattr(faiss, "index_cpu_to_all_gpus") or isinstance(index, faiss.IndexHNSW):
        return index
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True  # split rows across GPUs rather than replicating the whole matrix on each
    options.useFloat16 = fp16  # also lets IVFPQ use m > 48 sub-quantizers on GPU
    try:
        return faiss.index_cpu_to_all_gpus(index, co=options)
    except Exception as err:  # an index type or size the GPU build refuses: search on CPU instead
        logger.warning("could not copy the FAISS index (%d vectors) to %d GPUs (%s: %s); searching it on CPU "
                       "instead", index.ntotal, gpu_count(), type(err).__name__, err)
        return index


def flat_fp16_index(embeddings: np.ndarray, chunk_rows: int) -> Any:
    """Exact inner-product search over `embeddings` (n x d float16, a memmap) held as fp16 in host memory.

    FAISS's `QT_fp16` scalar quantizer stores each vector as IEEE half floats and widens it to fp32 while scoring,
    so its codes are the memmap's bytes: they are copied in chunks straight into a pre-sized buffer, with no fp32
    matrix at any point (a chunked numpy matmul would widen every chunk on every search instead).
    """
    import faiss

    if embeddings.dtype != np.float16:
        raise MapsTrainError(f"flat fp16 search needs float16 embeddings, got {embeddings.dtype}")
    count, dim = embeddings.shape
    index = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    code_bytes = count * dim * 2
    index.codes.resize(code_bytes)
    if count:
        codes = faiss.rev_swig_ptr(index.codes.data(), code_bytes).view(np.float16).reshape(count, dim)
        for start in range(0, count, chunk_rows):
            codes[start : start + chunk_rows] = embeddings[start : start + chunk_rows]
    index.ntotal = count
    return index


def flat_fp16_to_gpus(embeddings: np.ndarray, chunk_rows: int) -> Any:
    """A flat fp16 index split over every GPU, filled from the memmap a chunk at a time (only one chunk is ever
    widened to fp32 in host memory). Raises what FAISS raises; the caller falls back to `flat_fp16_index`."""
    import faiss

    count, dim = embeddings.shape
    gpus = gpu_count()
    rows_each = -(-count // gpus)
    shards = faiss.IndexShards(dim, True, True)  # threaded; successive ids: shard g's row 0 is row g * rows_each
    parts = []
    for gpu in range(gpus):
        rows = embeddings[gpu * rows_each : (gpu + 1) * rows_each]
        if not len(rows):
            break
        resources = faiss.StandardGpuResources()
        config = faiss.GpuIndexFlatConfig()
        config.device = gpu
        config.useFloat16 = True
        part = faiss.GpuIndexFlatIP(resources, dim, config)
        part.referenced_resources = resources  # keep the resources alive as long as the index
        _add_in_chunks(part, rows, chunk_rows, lambda done: None)
        shards.add_shard(part)
        parts.append(part)
    shards.referenced_parts = parts  # IndexShards does not own its shards: Python must keep them alive
    return shards


def to_first_gpu(index: Any) -> Any:
    """One GPU for building: k-means on a multi-GPU clone would train each copy separately."""
    import faiss

    if gpu_count() == 0 or not hasattr(faiss, "StandardGpuResources"):
        return index
    options = faiss.GpuClonerOptions()
    options.useFloat16 = True
    try:
        resources = faiss.StandardGpuResources()
        gpu_index = faiss.index_cpu_to_gpu(resources, 0, index, options)
        gpu_index.referenced_resources = resources  # keep the resources alive as long as the index
        return gpu_index
    except Exception as err:
        logger.warning("could not build the FAISS index on GPU (%s); using CPU", err)
        return index


def to_cpu(index: Any) -> Any:
    import faiss

    return faiss.index_gpu_to_cpu(index) if gpu_count() and hasattr(faiss, "index_gpu_to_cpu") else index


def set_search_params(index: Any, nprobe: int | None = None, ef_search: int | None = None) -> None:
    import faiss

    if nprobe is not None:
        try:
            faiss.extract_index_ivf(index).nprobe = nprobe
        except (RuntimeError, TypeError, AttributeError):
            pass  # not an IVF index
    if ef_search is not None and isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search


def build_from_memmap(
    embeddings: np.ndarray,
    index_type: str,
    params: dict[str, Any],
    chunk_rows: int,
    use_gpu: bool,
    progress: Callable[[int], None] = lambda rows: None,
) -> tuple[Any, dict[str, Any]]:
    """Build an index over `embeddings` (n x d, possibly fp16 on disk) reading `chunk_rows` rows at a time.

    Returns the CPU index and the parameters actually used (small corpora clamp some of them).
    """
    import faiss

    count, dim = embeddings.shape
    metric = faiss.METRIC_INNER_PRODUCT
    used: dict[str, Any] = {}
    if index_type == "flat":
        # Pre-size the code buffer and copy rows straight into it: repeated add() grows a vector by doubling,
        # which for a 64 GB matrix would briefly need twice its size.
        index = faiss.IndexFlatIP(dim)
        code_bytes = count * dim * 4
        index.codes.resize(code_bytes)
        if count:
            matrix = faiss.rev_swig_ptr(index.codes.data(), code_bytes).view(np.float32).reshape(count, dim)
            for start in range(0, count, chunk_rows):
                stop = min(start + chunk_rows, count)
                matrix[start:stop] = embeddings[start:stop]
                progress(stop - start)
        index.ntotal = count
        return index, used
    if index_type == "hnsw":
        used = {"M": int(params["hnsw_m"]), "efConstruction": int(params["hnsw_ef_construction"])}
        index = faiss.IndexHNSWFlat(dim, used["M"], metric)
        index.hnsw.efConstruction = used["efConstruction"]
        _add_in_chunks(index, embeddings, chunk_rows, progress)
        return index, used
    if index_type == "ivfpq":
        if count < IVFPQ_MIN_PASSAGES:
            raise MapsTrainError(
                f"index type ivfpq needs at least {IVFPQ_MIN_PASSAGES} passages (corpus has {count}); use flat"
            )
        pq_m = int(params["pq_m"])
        if dim % pq_m:
            raise MapsTrainError(f"retrieval.pq_m={pq_m} must divide the embedding dimension {dim}")
        nlist = max(1, min(int(params["ivf_nlist"]), count // 39))  # FAISS wants >= 39 training points per list
        used = {"nlist": nlist, "pq_m": pq_m, "pq_nbits": 8}
        quantizer = faiss.IndexFlatIP(dim)
        cpu_index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, 8, metric)
        index = to_first_gpu(cpu_index) if use_gpu else cpu_index
        sample_size = min(count, max(256 * nlist // 4, 64 * nlist, 100_000))
        sample_rows = np.sort(np.random.default_rng(0).choice(count, size=sample_size, replace=False))
        index.train(np.ascontiguousarray(embeddings[sample_rows], dtype=np.float32))
        _add_in_chunks(index, embeddings, chunk_rows, progress)
        return (to_cpu(index) if index is not cpu_index else index), used
    raise MapsTrainError(f"index type '{index_type}': expected one of {', '.join(INDEX_TYPES)}")


def _add_in_chunks(index: Any, embeddings: np.ndarray, chunk_rows: int, progress: Callable[[int], None]) -> None:
    count = embeddings.shape[0]
    for start in range(0, count, chunk_rows):
        stop = min(start + chunk_rows, count)
        index.add(np.ascontiguousarray(embeddings[start:stop], dtype=np.float32))
        progress(stop - start)
