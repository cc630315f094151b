"""MAPS engine throughput on the same questions, backend and retriever: one question at a time, step-synchronous
batches (one backend call per role per step), and continuous (every question on its own, calls batched by the
engine as they come: `agent.schedule`), plus the backend's raw throughput on exactly the role calls the continuous
run made, replayed in one continuously batched `generate` with no parsing or retrieval, so the engine's efficiency
is a ratio; and those calls' prefill alone (one generated token), batched and one at a time, which splits where
batching pays (decode) from where it cannot (prefill, compute-bound on a CPU): `one at a time / raw` is the
ceiling of any schedule on this backend. Every mode and replay starts with an empty prefix cache.

    .venv/bin/python bench/bench_agent.py --backend vllm --questions 64 --rounds 2 --directions 2 --top-k 3 \
        --max-tokens 192 --passage-words 60   # the demo teacher's settings [--modes one,step,continuous,raw,prefill]
        [--concurrency 64,32,16]   # continuous at each agent.concurrency: fewer questions in flight, less lockstep

Backends: `vllm` = SmolLM2-135M-Instruct on the vLLM engine with the role JSON schemas (constrained decoding), as
the demo's teacher; `hf` = the tiny Qwen3 through transformers (random weights; continuous then coalesces calls,
since HF has no continuous batching). A real model may stop at different rounds when batch shapes change its float
sums, so the modes can do slightly different work: compare the role calls and tokens printed beside the times.
Retrieval: MiniLM + a flat FAISS index over the paragraphs of the first HotpotQA dev questions (../shared/realdata).
Prints figures, ratios and the machine's load; nothing is asserted.

    .venv/bin/python bench/bench_agent.py --backend vllm --modes drivers --repeats 2 ...   # the same settings
        # the continuous run through each in-process vLLM driver (backend.vllm_engine: loop, async), alternately

Measured figures are in docs/throughput.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from maps_train.platform import apply_runtime_defaults  # noqa: E402

apply_runtime_defaults(offline=True)  # the vLLM-CPU binding and offline settings the Makefile used to set
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
REALDATA = REPO.parent / "shared" / "realdata"
sys.path.insert(0, str(REPO / "tests"))  # the small-world builder shared with the end-to-end tests


class Timed:
    """Counts the calls to one method of a backend or retriever and the seconds spent in them (from any thread);
    `keep=True` also keeps every request list given (the role calls to replay)."""

    def __init__(self, inner, method: str, keep: bool = False):
        self.inner, self.method, self.keep = inner, method, keep
        self.calls, self.seconds, self.kept = 0, 0.0, []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if name != self.method:
            return target

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                with self._lock:
                    self.calls += 1
                    self.seconds += time.perf_counter() - start
                    if self.keep:
                        self.kept.extend(args[0])

        return timed


def run(recipe, questions, out, router, retriever, schedule, batch_size, concurrency=None):
    from maps_train.agents import run_method

    recipe.agent.schedule, recipe.agent.batch_size = schedule, batch_size
    recipe.agent.concurrency = concurrency or batch_size
    cold(router)
    backend, search = Timed(router, "generate", keep=True), Timed(retriever, "search")
    start = time.perf_counter()
    records = run_method(recipe, questions, out, backend=backend, retriever=search, progress=False)
    return records, time.perf_counter() - start, backend, search


def cold(router) -> None:
    """Empty the vLLM engine's prefix cache, so that no mode (and not the raw replay) starts on the KV blocks of the
    same prompts computed by the mode before it."""
    backend = router.backend(router.route("default"))
    if getattr(backend, "llm", None) is not None:
        backend.llm.reset_prefix_cache()


def engine_steps(router) -> Counter:
    """Seconds the vLLM engine spent stepping so far, by requests in flight (empty for other backends)."""
    from maps_train.llm.vllm_backend import VLLMBackend

    backend = router.backend(router.route("default"))
    return Counter(backend.loop.step_seconds) if isinstance(backend, VLLMBackend) else Counter()


def print_busy(before: Counter, after: Counter, wall: float) -> None:
    """How a run kept the vLLM engine busy: its stepping time by batch size, and the rest of the wall time (idle).
    Nothing for a backend without an engine loop."""
    steps = after - before
    if not steps:
        return
    busy = sum(steps.values())
    buckets = ", ".join(f"{n}{'+' if n else ''}: {steps[n]:.1f}" for n in sorted(steps, reverse=True))
    print(f"{'':>19}engine busy {busy:.1f} s, idle {wall - busy:.1f} s; busy by requests in flight (s): {buckets}")


def replay(router, requests) -> float:
    """The backend alone on exactly these role calls: one `generate`, batched continuously by the engine."""
    cold(router)
    before = engine_steps(router)
    start = time.perf_counter()
    completions = router.generate(requests)
    raw = time.perf_counter() - start
    tokens = sum(c.prompt_tokens for c in completions), sum(c.completion_tokens for c in completions)
    print(f"{'raw backend':>17}: {raw:7.1f} s  the continuous run's {len(requests)} role calls replayed in one "
          f"generate() | {tokens[0]} prompt + {tokens[1]} completion tokens")
    print_busy(before, engine_steps(router), raw)
    return raw


def prefill_split(router, requests) -> dict[str, float]:
    """The same role calls cut to one generated token (their prefill, cold cache): all in one `generate`, then one
    call at a time. Their difference from the full runs is the decode, where batching pays; prefill is compute
    either way, so `one at a time / raw` is the most any schedule can gain on this backend."""
    from dataclasses import replace

    first_token = [replace(request, max_tokens=1) for request in requests]
    cold(router)
    start = time.perf_counter()
    router.generate(first_token)
    batched = time.perf_counter() - start
    cold(router)
    start = time.perf_counter()
    for request in first_token:
        router.generate([request])
    single = time.perf_counter() - start
    print(f"{'prefill only':>17}: {batched:7.1f} s batched, {single:.1f} s one call at a time "
          f"(the same {len(requests)} calls with max_tokens=1)")
    return {"prefill_raw": batched, "prefill_one": single}


def compare_drivers(recipe, questions, root, loop_router, retriever, gold, repeats: int) -> None:
    """The continuous run on the same questions through each in-process vLLM driver (`backend.vllm_engine`): two
    engines from the same settings, side by side, run alternately (loop, async, async, loop, ...) so that the
    shared machine's load falls on both alike. Greedy decoding: every run's tokens and answers should match the
    first loop run's; the differing ones are counted."""
    import copy

    from maps_train.llm.router import build_router
    from maps_train.records.metrics import cover_em

    async_recipe = copy.deepcopy(recipe)
    async_recipe.backend.vllm_engine = "async"
    routers = {"loop": loop_router, "async": build_router(async_recipe)}
    run(recipe, questions[:2], root / "warmup-async", routers["async"], retriever, "step", 2)
    order = [driver for i in range(repeats) for driver in (("loop", "async") if i % 2 == 0 else ("async", "loop"))]
    seconds: dict[str, list[float]] = {"loop": [], "async": []}
    reference, role_calls = None, []
    for n, driver in enumerate(order):
        records, took, backend, _ = run(recipe, questions, root / f"drivers-{n}-{driver}", routers[driver],
                                        retriever, "continuous", len(questions))
        seconds[driver].append(took)
        role_calls = role_calls or backend.kept
        calls = sum(r.cost.calls for r in records)
        tokens = {r.question_id: (r.cost.prompt_tokens, r.cost.completion_tokens) for r in records}
        answers = {r.question_id: r.answer for r in records}
        reference = reference or (tokens, answers)
        covered = sum(cover_em(r.answer or "", gold[r.question_id]) for r in records)
        print(f"{driver + ' run ' + str(len(seconds[driver])):>17}: {took:7.1f} s  {calls / took:5.2f} role calls/s | "
              f"{calls} role calls, {sum(p for p, _ in tokens.values())} prompt + "
              f"{sum(c for _, c in tokens.values())} completion tokens | Cover-EM {covered:.0f}/{len(records)} | vs "
              f"the first loop run: {sum(answers[q] != reference[1].get(q) for q in answers)} differing answers, "
              f"{sum(tokens[q] != reference[0].get(q) for q in tokens)} questions with differing token counts")
    for i, (loop_s, async_s) in enumerate(zip(seconds["loop"], seconds["async"]), 1):
        print(f"{'loop / async, pair ' + str(i):>36}: {loop_s / async_s:.2f}x")
    print(f"{'loop / async, all runs':>36}: {sum(seconds['loop']) / sum(seconds['async']):.2f}x "
          f"(above 1: async is faster)")
    replay_drivers(routers, role_calls, order)
    routers["async"].close()


def replay_drivers(routers, requests, order) -> None:
    """The first loop run's role calls, each driver given them all in one `generate()` (in the same order as the
    runs): a batch that no thread timing reshapes, so the drivers' tokens can be compared call by call."""
    seconds: dict[str, list[float]] = {"loop": [], "async": []}
    texts: dict[str, list[tuple[str, int]]] = {}  # the loop's first replay
    for driver in order:
        cold(routers[driver])
        start = time.perf_counter()
        completions = routers[driver].generate(requests)
        seconds[driver].append(time.perf_counter() - start)
        current = [(c.text, c.completion_tokens) for c in completions]
        first_loop = texts.setdefault("loop", current)  # the order starts with the loop
        differing = sum(a != b for a, b in zip(current, first_loop))
        print(f"{driver + ' replay':>17}: {seconds[driver][-1]:7.1f} s  {len(requests)} role calls in one generate(), "
              f"{sum(c.completion_tokens for c in completions)} completion tokens | {differing} calls whose text or "
              f"token count differs from the loop's first replay")
    print(f"{'replays, loop / async':>36}: {sum(seconds['loop']) / sum(seconds['async']):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--directions", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--passage-words", type=int, default=120, help="agent.max_passage_words")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--modes", default="one,step,continuous,raw,prefill",
                        help="comma-separated: one,step,continuous,raw,prefill (the last two replay the continuous "
                             "run); drivers (vllm: the continuous run through backend.vllm_engine loop and async)")
    parser.add_argument("--repeats", type=int, default=2, help="drivers: runs of each driver, alternating")
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated agent.concurrency values for the continuous mode (default: every "
                             "question at once); the raw replay and prefill split replay the first value's run")
    parser.add_argument("--dtype", default="auto",
                        help="backend.dtype (auto, the demo teacher's: bfloat16 where the CPU multiplies bf16)")
    args = parser.parse_args()
    if "drivers" in args.modes.split(",") and args.backend != "vllm":
        parser.error("--modes drivers compares the vLLM engine drivers: use --backend vllm")

    import torch
    from worlds import write_paragraph_world

    from maps_train.llm.router import build_router
    from maps_train.models import resolve_model
    from maps_train.platform import vllm_dtype, vllm_on_cpu
    from maps_train.questions import load_questions
    from maps_train.recipe import load_recipe
    from maps_train.records.metrics import cover_em
    from maps_train.retrieval.factory import build_retriever

    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench_agent_"))
    write_paragraph_world(REALDATA / "hotpotqa" / "dev.jsonl", args.questions, root)
    overrides = [
        f"retrieval.corpus={root / 'corpus.jsonl'}",
        "retrieval.encoder=builtin:minilm-l6",
        "retrieval.fp16=false",
        f"backend.dtype={args.dtype}",
        "backend.hf_batch_size=64",
        *(
            ["roles.default.backend=hf", f"roles.default.model={resolve_model('builtin:tiny-qwen3')}"]
            if args.backend == "hf"
            else [
                "roles.default.backend=vllm",
                "roles.default.model=builtin:smollm2-135m-instruct",
                "roles.default.structured=true",
                "backend.max_model_len=4096",
                "backend.enforce_eager=true",
            ]
        ),
        f"roles.default.max_tokens={args.max_tokens}",
        f"agent.max_rounds={args.rounds}",
        f"agent.num_directions={args.directions}",
        f"agent.top_k={args.top_k}",
        f"agent.max_passage_words={args.passage_words}",
    ]
    recipe = load_recipe(None, overrides)
    questions = load_questions(root / "questions.jsonl")
    gold = {q.id: q.golden_answers for q in questions}
    retriever = build_retriever(recipe.retrieval)  # builds the index (once)
    router = build_router(recipe)
    run(recipe, questions[:2], root / "warmup", router, retriever, "step", 2)  # load the model, warm the kernels

    modes = args.modes.split(",")
    resolved_dtype = args.dtype if args.backend == "hf" else vllm_dtype(args.dtype, vllm_on_cpu())
    print(
        f"{args.backend}: {len(questions)} questions, {args.rounds} rounds, N={args.directions}, top-{args.top_k}, "
        f"{args.passage_words} words/passage, max_tokens={args.max_tokens}, dtype {resolved_dtype}, "
        f"torch threads {torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}"
    )
    levels = [int(c) for c in args.concurrency.split(",")] if args.concurrency else [len(questions)]
    plan = [("step", "step-synchronous", "step", len(questions), None)]
    plan += [("continuous" if i == 0 else f"continuous c={level}",
              "continuous" if len(levels) == 1 else f"continuous c={level}", "continuous", len(questions), level)
             for i, level in enumerate(levels)]
    plan += [("one", "one at a time", "step", 1, None)]
    seconds = {}
    for mode, label, schedule, size, level in [p for p in plan if p[0].split(" ")[0] in modes]:  # one at a time last
        before = engine_steps(router)
        records, took, backend, search = run(recipe, questions, root / mode.replace(" ", "-").replace("=", ""),
                                             router, retriever, schedule, size, level)
        seconds[mode] = took
        calls = sum(r.cost.calls for r in records)
        prompt = sum(r.cost.prompt_tokens for r in records)
        completion = sum(r.cost.completion_tokens for r in records)
        covered = sum(cover_em(r.answer or "", gold[r.question_id]) for r in records)
        fallbacks = sum(sum(r.parse_failures.values()) for r in records)
        print(
            f"{label:>17}: {took:7.1f} s  {len(records) / took:6.2f} questions/s | {calls} role calls in "
            f"{backend.calls} generate() ({backend.seconds:.1f} s), {search.calls} search() ({search.seconds:.1f} s) "
            f"| {prompt} prompt + {completion} completion tokens, {sum(r.rounds for r in records)} rounds "
            f"| Cover-EM {covered:.0f}/{len(records)}, {fallbacks} parse fallbacks"
        )
        print_busy(before, engine_steps(router), took)
        if mode == "continuous" and "raw" in modes:
            seconds["raw"] = replay(router, backend.kept)
        if mode == "continuous" and "prefill" in modes:
            seconds.update(prefill_split(router, backend.kept))
    if "drivers" in modes:
        compare_drivers(recipe, questions, root, router, retriever, gold, args.repeats)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    for a, b, what in (("one", "continuous", "continuous vs one at a time"),
                       ("step", "continuous", "continuous vs step-synchronous"),
                       ("one", "step", "step-synchronous vs one at a time"),
                       ("one", "raw", "one at a time vs raw backend (ceiling)")):
        if a in seconds and b in seconds:
            print(f"{what:>36}: {seconds[a] / seconds[b]:.2f}x")
    if "continuous" in seconds and "raw" in seconds:
        print(f"{'engine vs raw backend (same calls)':>36}: {seconds['raw'] / seconds['continuous']:.2f} of the "
              "backend's throughput")
    for mode in [m for m in seconds if m.startswith("continuous c=")]:
        print(f"{mode + ' vs continuous c=' + str(levels[0]):>36}: {seconds['continuous'] / seconds[mode]:.2f}x"
              + (f", {seconds['raw'] / seconds[mode]:.2f} of the raw backend" if "raw" in seconds else ""))
    if {"prefill_raw", "prefill_one", "raw", "one"} <= seconds.keys():
        raw_decode, one_decode = seconds["raw"] - seconds["prefill_raw"], seconds["one"] - seconds["prefill_one"]
        print(f"{'prefill, one at a time vs batched':>36}: {seconds['prefill_one'] / seconds['prefill_raw']:.2f}x "
              f"({seconds['prefill_raw'] / seconds['raw']:.0%} of the raw run)")
        print(f"{'the rest, one at a time vs batched':>36}: {one_decode / max(raw_decode, 1e-9):.2f}x "
              f"(decode, and for one at a time parsing and retrieval too)")
    router.close()


if __name__ == "__main__":
    main()
