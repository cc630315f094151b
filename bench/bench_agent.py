"""MAPS engine throughput: a batch of questions advanced together (one backend call per role per step, one search
per step) vs the same questions one at a time, on the same backend and retriever.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_agent.py [--backend hf|vllm] [--questions 64] [--rounds 3]

Backends: `hf` = the tiny Qwen3 through transformers (random weights: it never says "sufficient", so every question
runs `--rounds` rounds in both modes and the work is the same); `vllm` = SmolLM2-135M-Instruct on the vLLM engine
with the role JSON schemas (constrained decoding), as the demo's teacher: a real model may stop early, so the two
modes can do different work: compare the role calls and tokens printed beside the times. Retrieval: MiniLM + a
flat FAISS index over the paragraphs of the first HotpotQA dev questions (../shared/realdata). Prints figures and
the ratio; nothing is asserted.

Measured on this project's 2-core CPU machine (quiet, one run): `--backend vllm --questions 16 --rounds 2
--directions 2 --max-tokens 64 --top-k 3 --passage-words 60`: batched 56.2 s (7 generate calls, 2 searches) vs one
at a time 169.0 s (91 generate calls, 25 searches) = 3.0x, with the same 108 role calls, the same tokens and the
same final answer for 16/16 questions.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from maps_train.platform import apply_runtime_defaults  # noqa: E402

apply_runtime_defaults(offline=True)  # the vLLM-CPU binding and offline settings the Makefile used to set
REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
REALDATA = REPO.parent / "shared" / "realdata"
sys.path.insert(0, str(REPO / "tests"))  # the small-world builder shared with the end-to-end tests


class Timed:
    """Counts the calls to one method of a backend or retriever and the seconds spent in them."""

    def __init__(self, inner, method: str):
        self.inner, self.method = inner, method
        self.calls, self.seconds = 0, 0.0

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if name != self.method:
            return target

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - start

        return timed


def run(recipe, questions, out, router, retriever, batch_size):
    from maps_train.agents import run_method

    recipe.agent.batch_size = batch_size
    backend, search = Timed(router, "generate"), Timed(retriever, "search")
    start = time.perf_counter()
    records = run_method(recipe, questions, out, backend=backend, retriever=search, progress=False)
    return records, time.perf_counter() - start, backend, search


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
    args = parser.parse_args()

    import torch
    from worlds import write_paragraph_world

    from maps_train.llm.router import build_router
    from maps_train.models import resolve_model
    from maps_train.questions import load_questions
    from maps_train.recipe import load_recipe
    from maps_train.retrieval.factory import build_retriever

    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench_agent_"))
    write_paragraph_world(REALDATA / "hotpotqa" / "dev.jsonl", args.questions, root)
    overrides = [
        f"retrieval.corpus={root / 'corpus.jsonl'}",
        "retrieval.encoder=builtin:minilm-l6",
        "retrieval.fp16=false",
        "backend.dtype=float32",
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
    retriever = build_retriever(recipe.retrieval)  # builds the index (once)
    router = build_router(recipe)
    run(recipe, questions[:2], root / "warmup", router, retriever, 2)  # load the model, warm the kernels

    print(
        f"{args.backend}: {len(questions)} questions, {args.rounds} rounds, N={args.directions}, top-{args.top_k}, "
        f"{args.passage_words} words/passage, max_tokens={args.max_tokens}, torch threads {torch.get_num_threads()}"
    )
    results = {}
    for label, batch_size in (("batched", len(questions)), ("one at a time", 1)):
        out = root / label.replace(" ", "_")
        records, seconds, backend, search = run(recipe, questions, out, router, retriever, batch_size)
        calls = sum(r.cost.calls for r in records)
        prompt = sum(r.cost.prompt_tokens for r in records)
        completion = sum(r.cost.completion_tokens for r in records)
        results[label] = (records, seconds)
        print(
            f"{label:>14}: {seconds:7.1f} s  {len(records) / seconds:6.2f} questions/s | {calls} role calls in "
            f"{backend.calls} generate() ({backend.seconds:.1f} s), {search.calls} search() ({search.seconds:.1f} s) "
            f"| {prompt} prompt + {completion} completion tokens, {sum(r['rounds'] for r in records)} rounds"
        )
    batched, single = results["batched"], results["one at a time"]
    same = sum(a.answer == b.answer for a, b in zip(batched[0], single[0]))
    print(
        f"speed-up of batching: {single[1] / batched[1]:.1f}x  (same final answer in {same}/{len(questions)}; "
        "batch shapes change float sums, so greedy text can differ)"
    )
    router.close()


if __name__ == "__main__":
    main()
