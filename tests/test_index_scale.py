"""The index at scale (issue 35): a flat index searched from the build's fp16 embeddings (no fp32 copy), the same
hits as the fp32 FAISS file, where it lives said in the log (and a failed GPU copy named), one retriever per
suite, and no reference cycle keeping a finished run's retriever alive.

Uses the session's MiniLM index over 200 passages (fixtures_retrieval.py); the suite runs with a scripted
`run_method` because only the retriever it is handed is under test here.
"""

from __future__ import annotations

import gc
import json
import logging
import weakref
from pathlib import Path

import faiss
import numpy as np
import pytest
from fixtures_retrieval import QUERIES

from maps_train.agents.schedule import CoalescingRetriever
from maps_train.retrieval.base import Hit
from maps_train.retrieval.dense import DenseRetriever


@pytest.fixture(scope="module")
def dense_fp16(dense_dir, encoder):
    """The flat index held in fp16, as a host without room for its fp32 copy holds it."""
    return DenseRetriever(dense_dir, encoder=encoder, flat_precision="fp16")


def test_flat_index_holds_the_fp16_embeddings_not_an_fp32_copy(dense_fp16, dense_dir):
    embeddings = np.load(Path(dense_dir) / "embeddings.npy", mmap_mode="r")
    count, dim = embeddings.shape
    index = dense_fp16.index
    assert isinstance(index, faiss.IndexScalarQuantizer)
    assert index.sa_code_size() == dim * 2  # 2 bytes per dimension, not 4
    held = faiss.vector_to_array(index.codes)
    assert held.nbytes == count * dim * 2
    assert np.array_equal(held.view(np.float16).reshape(count, dim), embeddings)


def test_same_hits_as_the_fp32_flat_index(dense_fp16, dense_dir):
    manifest = json.loads((Path(dense_dir) / "manifest.json").read_text())
    fp32_index = faiss.read_index(str(Path(dense_dir) / manifest["index"]["file"]))
    assert isinstance(fp32_index, faiss.IndexFlatIP)
    vectors = dense_fp16.encode_queries(QUERIES)
    fp32_scores, fp32_rows = fp32_index.search(vectors, 10)
    fp16_scores, fp16_rows = dense_fp16.index.search(vectors, 10)
    assert np.array_equal(fp16_rows, fp32_rows)
    np.testing.assert_allclose(fp16_scores, fp32_scores, atol=1e-5)  # only the summation order differs
    hits = dense_fp16.search(QUERIES[:1], 3)[0]
    assert [hit.score for hit in hits] == pytest.approx([float(s) for s in fp32_scores[0, :3]], abs=1e-5)


def test_load_logs_where_the_index_lives(dense_dir, encoder, caplog):
    with caplog.at_level(logging.INFO, logger="maps_train.retrieval.dense"):
        retriever = DenseRetriever(dense_dir, encoder=encoder, use_gpu=False, threads=2)
    assert f"index: 200 passages, flat fp32, on CPU, 2 search threads ({dense_dir})" in caplog.messages
    assert retriever.location == "CPU"


def test_the_flat_index_is_fp32_where_the_host_holds_it_else_fp16(dense_dir, encoder, dense_fp16, monkeypatch):
    """Issue 47: FAISS's fp16 flat index gets no BLAS (4.1x fewer queries/s than fp32 on one thread,
    bench/bench_flat_precision.py). By default the fp32 index is searched where its vectors take at most half the
    host's memory (the 200 x 384 index here: 0.3 MB), the fp16 one where they do not (a host of 0.5 MB), with the
    same hits; the recipe may force either. The plan says which, from the stated host."""
    import maps_train.retrieval.faiss_index as faiss_index
    from maps_train.plan.stages import make_plan

    fp32 = DenseRetriever(dense_dir, encoder=encoder, use_gpu=False)
    assert isinstance(fp32.index, faiss.IndexFlatIP) and fp32.storage == "flat fp32"
    assert [[hit.id for hit in hits] for hits in fp32.search(QUERIES, 5)] == \
        [[hit.id for hit in hits] for hits in dense_fp16.search(QUERIES, 5)]
    monkeypatch.setattr(faiss_index, "host_memory_bytes", lambda: 500_000)  # 200 x 384 x 4 = 307,200 > half
    small = DenseRetriever(dense_dir, encoder=encoder, use_gpu=False)
    assert isinstance(small.index, faiss.IndexScalarQuantizer) and small.storage == "flat fp16"
    forced = DenseRetriever(dense_dir, encoder=encoder, use_gpu=False, flat_precision="fp32")
    assert forced.storage == "flat fp32"
    assert faiss_index.flat_precision(21_015_324, 768, 1000e9) == "fp32"  # 64.6 GB of a 1 TB host
    assert faiss_index.flat_precision(21_015_324, 768, 100e9) == "fp16"
    assert faiss_index.flat_precision(21_015_324, 768, 100e9, "fp32") == "fp32"

    def searched(plan):
        (row,) = [row for row in plan.rows if row.stage == "traces/eval" and row.process.startswith("FAISS")]
        return row.per_device, row.note

    size, note = searched(make_plan("recipes/teacher/qwen3-32b.yaml", []))
    assert size == 21_015_324 * 768 * 4 and note.endswith("flat fp32 (BLAS search: the host holds it)")
    size, note = searched(make_plan("recipes/teacher/qwen3-32b.yaml", [], memory_gb=100))
    assert size == 21_015_324 * 768 * 2 and note.endswith("flat fp16 (fp32 would take over half the host)")


def test_faiss_searches_on_the_threads_the_rank_is_given(dense_dir, encoder, monkeypatch):
    """accelerate sets OMP_NUM_THREADS=1 in every rank: a rank searching in process would score on one thread.
    The retriever sets FAISS's threads where each search runs: the machine's CPUs over the ranks on it
    (LOCAL_WORLD_SIZE), or retrieval.search_threads."""
    import os
    import threading

    import maps_train.retrieval.faiss_index as faiss_index

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert faiss_index.search_threads() == cpus and faiss_index.search_threads(3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cpus * 2))
    assert faiss_index.search_threads() == 1
    retriever = DenseRetriever(dense_dir, encoder=encoder, use_gpu=False, threads=3)
    seen = []

    def search_in_a_new_thread():
        faiss.omp_set_num_threads(1)  # as OMP_NUM_THREADS=1 leaves it
        retriever.search(QUERIES[:2], 3)
        seen.append(faiss.omp_get_max_threads())

    worker = threading.Thread(target=search_in_a_new_thread)
    worker.start()
    worker.join()
    assert seen == [3]


def test_failed_gpu_copy_is_named_and_falls_back_to_cpu(dense, dense_dir, encoder, caplog, monkeypatch):
    """This FAISS is a CPU build: told there is a GPU, the GPU copy fails for real (no GpuIndexFlatIP)."""
    import maps_train.retrieval.faiss_index as faiss_index

    monkeypatch.setattr(faiss_index, "gpu_count", lambda: 1)
    with caplog.at_level(logging.INFO, logger="maps_train.retrieval"):
        retriever = DenseRetriever(dense_dir, encoder=encoder, use_gpu=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("could not place the flat fp16 index (200 vectors) on 1 GPUs (AttributeError:")
    assert warnings[0].endswith("searching it on CPU instead")
    assert retriever.location == "CPU" and isinstance(retriever.index, faiss.IndexScalarQuantizer)
    fallback, flat = retriever.search(QUERIES, 3), dense.search(QUERIES, 3)
    assert [[hit.id for hit in hits] for hits in fallback] == [[hit.id for hit in hits] for hits in flat]
    # the same fp16 embeddings: only the summation order differs (by SIMD width, so by machine)
    np.testing.assert_allclose([[h.score for h in hits] for hits in fallback],
                               [[h.score for h in hits] for hits in flat], atol=1e-5)


def _suite(tmp_path: Path, short_corpus: Path) -> Path:
    data = tmp_path / "data"
    for name, split in (("nq", "test"), ("hotpotqa", "dev")):
        (data / name).mkdir(parents=True)
        rows = [{"id": f"{name}{i}", "question": f"q {i}", "golden_answers": [f"a {i}"]} for i in range(3)]
        (data / name / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    other_corpus = tmp_path / "other.jsonl"
    other_corpus.write_text(short_corpus.read_text())
    (tmp_path / "recipe.yaml").write_text(f"name: tiny\nretrieval: {{corpus: {short_corpus}}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"""name: shared
out_dir: {tmp_path / 'out'}
data_root: {data}
parallel_runs: 2
datasets: [{{name: nq}}, {{name: hotpotqa}}]
systems:
  - {{name: maps, recipe: recipe.yaml, overrides: [agent.method=maps]}}
  - {{name: vanilla, recipe: recipe.yaml, overrides: [agent.method=vanilla, agent.top_k=3]}}
  - {{name: other, recipe: recipe.yaml, overrides: [agent.method=vanilla, "retrieval.corpus={other_corpus}"]}}
wandb: {{enabled: false}}
"""
    )
    return suite


def test_one_retriever_per_retrieval_config_shared_by_a_suites_runs(tmp_path, short_corpus, monkeypatch):
    import maps_train.evaluate.suite as suite_module
    import maps_train.retrieval.factory as factory
    from maps_train.evaluate.suite import run_suite

    built: list[str] = []

    class NamedRetriever:
        def __init__(self, corpus: str):
            self.corpus = corpus

        def search(self, queries: list[str], k: int) -> list[list[Hit]]:
            return [[] for _ in queries]

    def counting_build(cfg):
        built.append(cfg.corpus)
        return NamedRetriever(cfg.corpus)

    handed: dict[tuple[str, str], object] = {}  # (system, data set) -> the retriever its run was given

    def scripted_run_method(recipe, pending, run_dir, *, backend=None, retriever=None, progress=True):
        handed[(Path(run_dir).parent.name, Path(run_dir).name)] = retriever
        return [{"question_id": q.id, "answer": q.golden_answers[0], "method": recipe.agent.method} for q in pending]

    monkeypatch.setattr(factory, "build_retriever", counting_build)
    monkeypatch.setattr(suite_module, "default_runner", lambda: scripted_run_method)
    outcome = run_suite(_suite(tmp_path, short_corpus), progress=False)

    assert outcome.scored == 3 * 2 * 3
    assert sorted(built) == sorted([str(short_corpus), str(tmp_path / "other.jsonl")])  # 6 runs, 2 configs
    assert len(handed) == 6
    same_corpus = {id(handed[system, data]) for system in ("maps", "vanilla") for data in ("nq", "hotpotqa")}
    other_corpus = {id(handed["other", data]) for data in ("nq", "hotpotqa")}
    assert len(same_corpus) == 1 and len(other_corpus) == 1 and same_corpus != other_corpus


def test_coalescing_retriever_releases_its_inner_retriever_without_the_garbage_collector():
    class Inner:
        def search(self, queries, k):
            return [[] for _ in queries]

    inner = Inner()
    alive = weakref.ref(inner)
    wrapper = CoalescingRetriever(inner)
    assert wrapper.search(["q"], 2) == [[]]
    gc.disable()  # a cycle would now keep `inner` (in real runs: a whole index) alive
    try:
        wrapper.close()
        del wrapper, inner
        assert alive() is None
    finally:
        gc.enable()
