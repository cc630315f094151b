"""Benchmark the LLM backends: one batched call of N requests vs the same requests one at a time, per backend.

    .venv/bin/python bench/bench_llm.py                          # hf, vllm, openai on SmolLM2, 64 requests
    .venv/bin/python bench/bench_llm.py --backends hf --n 16 --max-tokens 8

Requests are real questions from ../shared/realdata when present (else generated ones), greedy, with a fixed
max_tokens; half go through a random LoRA adapter (real PEFT weights) so multi-LoRA batching is measured too.
The vLLM engine and the server never run at the same time. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from maps_train.platform import apply_runtime_defaults  # noqa: E402

apply_runtime_defaults(offline=True)  # the vLLM-CPU binding and offline settings the Makefile used to set
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
sys.path.insert(0, str(REPO / "tests"))  # server start/stop helpers shared with the test fixtures


def questions(n: int) -> list[str]:
    path = REPO.parent / "shared" / "realdata"
    found = sorted(path.glob("*/*.jsonl")) if path.exists() else []
    texts: list[str] = []
    for file in found:
        if "corpus" in file.parts:
            continue
        with file.open() as handle:
            for line in handle:
                row = json.loads(line)
                if "question" in row:
                    texts.append(row["question"])
                if len(texts) >= n:
                    return texts
    return (texts + [f"What is the population of city number {i}?" for i in range(n)])[:n]


def make_requests(n: int, max_tokens: int):
    from maps_train.llm import ChatRequest

    return [
        ChatRequest(
            role="writer" if i % 2 else "answer",
            question_id=f"q{i}",
            max_tokens=max_tokens,
            messages=[{"role": "system", "content": "Answer in a few words."}, {"role": "user", "content": q}],
        )
        for i, q in enumerate(questions(n))
    ]


def measure(router, requests) -> dict[str, float]:
    start = time.perf_counter()
    batched = router.generate(requests)
    batch_s = time.perf_counter() - start
    start = time.perf_counter()
    single = [router.generate([req])[0] for req in requests]
    single_s = time.perf_counter() - start
    tokens_b = sum(c.completion_tokens for c in batched)
    tokens_s = sum(c.completion_tokens for c in single)
    same = sum(a.text == b.text for a, b in zip(batched, single))
    return {
        "batch_s": batch_s,
        "single_s": single_s,
        "ratio": single_s / batch_s,
        "batch_tok_s": tokens_b / batch_s,
        "single_tok_s": tokens_s / single_s,
        "same_text": same,
    }


def report(name: str, fig: dict[str, float], n: int) -> None:
    print(
        f"{name:7s} batch of {n}: {fig['batch_s']:7.2f}s ({fig['batch_tok_s']:6.1f} tok/s) | one at a time: "
        f"{fig['single_s']:7.2f}s ({fig['single_tok_s']:6.1f} tok/s) | speed-up x{fig['ratio']:.1f} | "
        f"same text {fig['same_text']}/{n}",
        flush=True,
    )


def routes_for(kind: str, model: str, adapter: str):
    from maps_train.recipe import RoleRoute

    return {
        "answer": RoleRoute(backend=kind, model=model),
        "writer": RoleRoute(backend=kind, model=model, adapter=adapter),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="hf,vllm,openai")
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    from fixtures_llm import build_lora_adapters, start_vllm_server

    from maps_train.llm.router import Router
    from maps_train.models import resolve_model
    from maps_train.platform import free_port
    from maps_train.recipe import BackendConfig
    from maps_train.serve.server import stop_process_group

    model = resolve_model(args.model)
    requests = make_requests(args.n, args.max_tokens)
    config = BackendConfig(dtype="float32", enforce_eager=True, max_model_len=2048, hf_batch_size=args.n)
    work = Path(tempfile.mkdtemp(prefix="bench_llm_"))
    adapter = build_lora_adapters(model, work, ["writer"])["writer"]
    print(
        f"model {args.model}, {args.n} requests (half via a LoRA adapter), max_tokens {args.max_tokens}, greedy",
        flush=True,
    )

    for kind in args.backends.split(","):
        if kind == "hf":
            from maps_train.llm.hf_backend import HFBackend

            backend = HFBackend(model, config)
            report("hf", measure(Router(routes_for("hf", model, adapter), backends={"hf": backend}), requests), args.n)
            backend.close()
        elif kind == "vllm":
            from maps_train.llm.vllm_backend import VLLMBackend

            backend = VLLMBackend(model, config, max_loras=1)
            start = time.perf_counter()
            backend.generate(requests[:1])
            print(f"vllm    engine start + first call {time.perf_counter() - start:.1f}s", flush=True)
            report(
                "vllm",
                measure(Router(routes_for("vllm", model, adapter), backends={"vllm": backend}), requests),
                args.n,
            )
            backend.close()
        elif kind == "openai":
            from maps_train.llm.openai_backend import OpenAIBackend

            port = free_port()
            start = time.perf_counter()
            proc = start_vllm_server(model, {"writer": adapter}, port, work / "server.log")
            print(f"openai  server start {time.perf_counter() - start:.1f}s", flush=True)
            try:
                backend = OpenAIBackend(
                    BackendConfig(base_urls=[f"http://127.0.0.1:{port}/v1"], concurrency=64, max_model_len=2048)
                )
                routes = routes_for("openai", model, "writer")
                report("openai", measure(Router(routes, backends={"openai": backend}), requests), args.n)
                backend.close()
            finally:
                stop_process_group(proc)


if __name__ == "__main__":
    main()
