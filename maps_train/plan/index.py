"""The index: built once by `maps-train index build`, then searched in process by every agent run (or over HTTP).

An in-process dense index is cloned to every GPU in fp16, split over them, where the machine's FAISS is a GPU
build (`hardware.faiss_gpu`, `retrieval.faiss_index.to_gpus`), else it is searched in host memory; its encoder
sits on GPU 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.plan import memory
from maps_train.plan.memory import GB
from maps_train.plan.rows import Row, gb, gpu_range, host_row
from maps_train.plan.shapes import model_shape
from maps_train.recipe import HardwareConfig, Recipe
from maps_train.retrieval.faiss_index import LOAD_CHUNK_ROWS, flat_precision

CORPORA = Path(__file__).with_name("corpora.json")


def corpus_passages(cfg) -> tuple[int, str]:
    """Passages in the corpus: the index manifest's count, the shipped count of a known corpus, or the file's lines."""
    if cfg.index_dir and (Path(cfg.index_dir) / "manifest.json").is_file():
        manifest = json.loads((Path(cfg.index_dir) / "manifest.json").read_text(encoding="utf-8"))
        return int(manifest["count"]), f"{cfg.index_dir}/manifest.json"
    known = json.loads(CORPORA.read_text(encoding="utf-8"))
    if Path(cfg.corpus).name in known:
        return known[Path(cfg.corpus).name]["passages"], str(CORPORA.name)
    path = Path(cfg.corpus)
    if path.is_file():
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip()), str(path)
    raise MapsTrainError(f"retrieval.corpus: {cfg.corpus} is not here, not a known corpus ({', '.join(known)}) "
                         f"and retrieval.index_dir has no manifest.json: its size is unknown")


@dataclass(frozen=True)
class IndexLoad:
    gpu_each: float  # per GPU (the fp16 shard and FAISS's temporary memory)
    encoder: float  # on GPU 0 (or the host)
    host: float  # in host memory while searching: the fp16 flat index (one fp32 chunk with FAISS on GPUs), or
    # the hnsw/compressed index
    build_host: float  # in host memory while `index build` writes it (a flat index is written in fp32)
    note: str
    search_note: str = ""  # the note of the searched index (a flat one's precision)


def index_load(cfg, hardware: HardwareConfig) -> IndexLoad | None:
    """What an in-process dense retriever holds; None for BM25 or a retrieval service (elsewhere)."""
    if cfg.service_url or cfg.kind != "dense":
        return None
    passages, counted = corpus_passages(cfg)
    encoder = model_shape(cfg.encoder)
    dim = encoder.hidden_size
    # counted as a decoder layer stack (a gated MLP), which overstates a BERT encoder by a quarter: a few hundred MB
    encoder_bytes = encoder.parameters() * (memory.BF16 if cfg.fp16 else memory.FP32) + 0.5 * GB
    if cfg.index_type == "ivfpq":
        host = memory.ivfpq_index_bytes(passages, dim, cfg.ivf_nlist, cfg.pq_m)
        gpu = host
    elif cfg.index_type == "hnsw":
        host = memory.flat_index_bytes(passages, dim, memory.FP32) + passages * cfg.hnsw_m * 2 * 4
        gpu = 0.0  # FAISS has no GPU HNSW: it stays in host memory
    else:  # split over the GPUs from the fp16 embeddings, or in host memory in fp32 where half the host holds it,
        # else fp16 (retrieval/dense.py, faiss_index.flat_precision)
        gpu = memory.flat_index_bytes(passages, dim, memory.BF16)
        precision = flat_precision(passages, dim, hardware.memory_gb * GB, cfg.flat_precision)
        host = memory.flat_index_bytes(passages, dim, memory.FP32 if precision == "fp32" else memory.BF16)
        if hardware.faiss_gpu and hardware.gpus:
            host = LOAD_CHUNK_ROWS * dim * memory.FP32
    if not hardware.faiss_gpu:  # faiss-cpu: the index stays in host memory
        gpu = 0.0
    build_host = memory.flat_index_bytes(passages, dim, memory.FP32) if cfg.index_type == "flat" else host
    gpu_each = gpu / hardware.gpus + memory.FAISS_TEMP_BYTES if hardware.gpus and gpu else 0.0
    note = f"{passages:,} passages x {dim} ({counted}), {cfg.index_type}"
    searched = note
    if cfg.index_type == "flat" and not gpu:
        searched += (" fp32 (BLAS search: the host holds it)" if precision == "fp32" else
                     " fp16 (fp32 would take over half the host)")
    return IndexLoad(gpu_each, encoder_bytes, host, build_host, note, searched)


def index_rows(recipe: Recipe, hardware: HardwareConfig) -> list[Row]:
    cfg = recipe.retrieval
    if cfg.service_url:
        return [Row("index", "retrieval service", cfg.service_url, 0, 0, "searched over HTTP: sized where it runs")]
    if cfg.kind != "dense":
        return [Row("index", "BM25 (bm25s, memory-mapped)", "host", 0, hardware.memory_gb * GB, "not modelled")]
    load = index_load(cfg, hardware)
    passages, _ = corpus_passages(cfg)
    memmap = memory.flat_index_bytes(passages, model_shape(cfg.encoder).hidden_size, memory.BF16)
    where = "GPU 0" if hardware.gpus else "host"
    rows = [Row("index build", f"encoder {cfg.encoder}", where, load.encoder,
                hardware.gpu_memory_gb * GB if hardware.gpus else hardware.memory_gb * GB,
                f"embeddings memmap (fp16) on disk: {gb(memmap)}")]
    rows.append(host_row("index build", "FAISS index (fp32, host)", load.build_host, hardware, load.note,
                         "retrieval.index_type=ivfpq (compressed) or a machine with more memory"))
    if hardware.gpus and load.gpu_each:
        rows.append(Row("index search", "FAISS index (fp16, split over every GPU)", gpu_range(0, hardware.gpus),
                        load.gpu_each, hardware.gpu_memory_gb * GB, "beside the engines: see the per-GPU sums"))
    return rows
