"""Retrieval speed: batched vs one-at-a-time search, index-build overhead over the bare encoder, and the HTTP
service under 16 concurrent clients vs in-process search.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_retrieval.py [--passages 128] [--queries 32] [--clients 16]

Passages are the first N of ../shared/realdata/corpus (full length); queries are real HotpotQA questions.
Prints figures and ratios; nothing is asserted (speed is measured here, never in tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from maps_train.platform import apply_runtime_defaults, free_port  # noqa: E402

apply_runtime_defaults(offline=True)  # the vLLM-CPU binding and offline settings the Makefile used to set
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
REALDATA = REPO.parent / "shared" / "realdata"


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def best_of(repeats: int, function, *args, **kwargs) -> float:
    """Fastest of `repeats` runs: the machine is shared, and the minimum is the least disturbed figure."""
    return min(timed(function, *args, **kwargs)[1] for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=128)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="Best of N for every timing (2 for encoding)")
    args = parser.parse_args()

    import torch

    from maps_train.errors import MapsTrainError
    from maps_train.recipe import RetrievalConfig
    from maps_train.retrieval.build import build_dense_index
    from maps_train.retrieval.client import RetrievalClient
    from maps_train.retrieval.corpus import Corpus
    from maps_train.retrieval.dense import DenseRetriever
    from maps_train.retrieval.encoders import Encoder
    from maps_train.serve.server import start_process_group, stop_process_group

    work = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    corpus_path = work / "corpus.jsonl"
    with (REALDATA / "corpus" / "corpus.jsonl").open(encoding="utf-8") as source, corpus_path.open("w") as sink:
        for _, line in zip(range(args.passages), source):
            sink.write(line)
    questions = [json.loads(line)["question"] for line in (REALDATA / "hotpotqa" / "dev.jsonl").open()]
    queries = questions[: args.queries]
    print(
        f"# retrieval bench: {args.passages} passages, {len(queries)} queries, k={args.k}, "
        f"torch threads={torch.get_num_threads()}, cpus={os.cpu_count()}"
    )

    # ---- build throughput vs the bare encoder ----
    encoder = Encoder("builtin:minilm-l6", batch_size=64)
    texts = [passage.contents for passage in Corpus(corpus_path).iter_rows()]
    encoder.encode_passages(texts[:8])  # warm-up
    settings = RetrievalConfig(chunk_size=64, encode_batch_size=64)
    encode_repeats = max(1, min(2, args.repeats))
    chunk = settings.chunk_size

    def bare_encode() -> None:  # the same chunks, so the same batches (and padded shapes) as the build
        for start in range(0, len(texts), chunk):
            encoder.encode_passages(texts[start : start + chunk], batch_size=settings.encode_batch_size)

    bare_s = best_of(encode_repeats, bare_encode)
    build_s = best_of(
        encode_repeats,
        build_dense_index,
        corpus_path,
        work / "index",
        settings,
        encoder=encoder,
        force=True,
        show_progress=False,
    )
    print(f"bare encoder:  {args.passages / bare_s:8.1f} passages/s ({bare_s:.1f} s)")
    print(
        f"index build:   {args.passages / build_s:8.1f} passages/s ({build_s:.1f} s; chunks of 64, memmap, "
        f"progress file, FAISS flat, manifest)"
    )
    last_build = json.loads((work / "index" / "manifest.json").read_text())["build"]
    print(f"build overhead ratio (build time / bare encode time, best of {encode_repeats}): {build_s / bare_s:.3f}")
    print(
        f"last build: {last_build['seconds_this_run']:.2f} s, of which encoding {last_build['encode_seconds_this_run']:.2f} s "
        f"(the rest: corpus reads, memmap, progress file, FAISS, manifest)"
    )

    # ---- batched vs one query at a time ----
    dense = DenseRetriever(work / "index", encoder=encoder)
    dense.search(queries[:4], args.k)  # warm-up
    batched_s = best_of(args.repeats, dense.search, queries, args.k)
    single_s = best_of(args.repeats, lambda: [dense.search([query], args.k) for query in queries])
    print(f"in-process batched:    {len(queries) / batched_s:8.1f} queries/s")
    print(f"in-process one-by-one: {len(queries) / single_s:8.1f} queries/s")
    print(f"batched speed-up: {single_s / batched_s:.2f}x")

    # ---- the HTTP service under concurrent clients ----
    port = free_port()
    # its own session and tied to this process's life: a bench killed outright leaves no service on the port
    server = start_process_group(
        [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(work / "index"), "--port",
         str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        client = RetrievalClient(f"http://127.0.0.1:{port}", timeout_s=120, retries=0)
        deadline = time.time() + 180
        while True:
            try:
                client.health()
                break
            except MapsTrainError:  # not listening yet
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("retrieval service did not start") from None
                time.sleep(0.5)
        client.search(queries[:4], args.k)  # warm-up
        stream = [queries[i % len(queries)] for i in range(args.clients * args.requests_per_client)]

        def clients_calling(search) -> None:
            def one_client(offset: int) -> None:
                for i in range(args.requests_per_client):
                    search([stream[offset * args.requests_per_client + i]], args.k)

            with ThreadPoolExecutor(max_workers=args.clients) as pool:
                list(pool.map(one_client, range(args.clients)))

        # CPU oneDNN builds kernels for every new (batch, length) shape the first time (~0.4-0.9 s each here), and
        # dynamic batching makes many shapes: warm both sides on the same traffic before timing
        for _ in range(2):
            clients_calling(client.search)
            clients_calling(dense.search)
        before = client.health()["stats"]
        service_s = best_of(args.repeats, clients_calling, client.search)
        after = client.health()["stats"]
        calls = (after["search_calls"] - before["search_calls"]) / args.repeats
        threads_s = best_of(args.repeats, clients_calling, dense.search)
        inproc_batched_s = best_of(args.repeats, dense.search, stream, args.k)
        print(
            f"service, {args.clients} clients x {args.requests_per_client} single-query requests: "
            f"{len(stream) / service_s:8.1f} queries/s in {calls:.1f} search calls "
            f"(mean {len(stream) / max(calls, 1):.1f} queries per call)"
        )
        print(
            f"in-process, {args.clients} threads x {args.requests_per_client} single-query calls: "
            f"{len(stream) / threads_s:8.1f} queries/s"
        )
        print(
            f"in-process, the same {len(stream)} queries as one batch: {len(stream) / inproc_batched_s:8.1f} queries/s"
        )
        print(
            f"service vs in-process threads: {threads_s / service_s:.2f}x; "
            f"service vs one in-process batch: {inproc_batched_s / service_s:.2f}x"
        )
    finally:
        stop_process_group(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
