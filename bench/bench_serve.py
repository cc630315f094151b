"""Multi-LoRA serving overhead: the same MAPS run through `vllm serve` with three role adapters vs the base alone.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_serve.py [--questions 8] [--rounds 2] [--repeats 2] [--adapters DIR]

Three runs of MAPS over the demo world's test questions (BM25 retrieval, SmolLM2-135M-Instruct, structured outputs):
  base     a plain server (no LoRA), every role on the base model
  lora+base  the `maps-train serve` server (three adapters, plan_server + VLLMServer), every role on the base model
  adapters the same server, each role on its own adapter (with_student_routes(recipe, distilled_set(recipe), via="server"))
The LoRA server runs once per `--lora-ops` choice: `grouped` (maps-train's vLLM plugin, maps_train/llm/vllm_cpu_lora.py:
its ops and its fused `add_lora_linear`), `ops` (its ops under vLLM's own wrapper method: two op calls per output
slice) and `reference` (vLLM-CPU's own per-token gather + einsum).
By default the adapters are r=8 on every projection with PEFT's "gaussian" init (B = 0): vLLM computes the full LoRA
path but the outputs equal the base's, so all three runs generate the same tokens and the ratios are pure
serving overhead. `--adapters DIR` (holding proposer/, writer/, consolidator/) uses trained adapters instead;
their outputs differ, so compare tokens/s there. The first run on a server also compiles the roles' JSON-schema
grammars (cached after), so each configuration runs `--repeats` times, alternating, and the best is kept.
One server at a time. Prints figures; asserts nothing.

Measured on a 2-core AVX2 machine (vllm-cpu 0.32, float32, 8 questions, N=3, 2 rounds, --repeats 1, one run):
base 50.1 s; lora+base 58.5 s (x1.17) grouped, 60.1 s (x1.20) reference; adapters 66.7 s (x1.33) grouped,
104.0 s (x2.07) reference: grouped ops 1.56x faster; 1973 completion tokens and the same answers in all five.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from maps_train.platform import apply_runtime_defaults  # noqa: E402

apply_runtime_defaults(offline=True)  # the vLLM-CPU binding and offline settings the Makefile used to set
os.environ.setdefault("MAPS_TRAIN_HOME", str(REPO / ".cache" / "maps-train"))
ROLES = ("proposer", "writer", "consolidator")
MODEL = "builtin:smollm2-135m-instruct"


def zero_adapters(base: str, out: Path, r: int = 8) -> Path:
    """One r=`r` adapter per role with B = 0 (PEFT's gaussian init): full LoRA compute, base outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from maps_train.train.adapter_check import SUPPORTED_MODULES

    for i, role in enumerate(ROLES):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(SUPPORTED_MODULES),
                            init_lora_weights="gaussian", task_type="CAUSAL_LM")
        get_peft_model(model, config).save_pretrained(str(out / role))
    return out


def make_recipe(work: Path, adapters: Path, args):
    from maps_train.platform import free_port
    from maps_train.recipe import load_recipe

    return load_recipe(None, [
        "name=bench-serve",
        f"retrieval.corpus={REPO / 'data/demo/corpus.jsonl'}", "retrieval.kind=bm25",
        f"retrieval.index_dir={work / 'index'}",
        "backend.dtype=float32", "backend.enforce_eager=true", "backend.max_model_len=2048",
        f"backend.concurrency={args.concurrency}",
        "roles.default.backend=openai", f"roles.default.model={MODEL}", f"roles.default.max_tokens={args.max_tokens}",
        f"agent.num_directions={args.directions}", f"agent.max_rounds={args.rounds}", "agent.top_k=3",
        "agent.max_passage_words=60", f"agent.batch_size={args.questions}",
        f"train.student={MODEL}", f"serve.adapters_dir={adapters}", f"serve.port={free_port()}",
        "serve.startup_timeout_s=600",
    ])


def base_only(plan):
    """The plan's command without the LoRA flags: the same server, minus multi-LoRA."""
    command, skip = [], 0
    lora_flags = {"--max-loras": 1, "--max-lora-rank": 1, "--lora-modules": len(plan.adapters), "--enable-lora": 0}
    for token in plan.command:
        if skip:
            skip -= 1
            continue
        if token in lora_flags:
            skip = lora_flags[token]
            continue
        command.append(token)
    return replace(plan, command=command, adapters={})


def run_maps(recipe, url: str, questions, out: Path, retriever) -> dict:
    from maps_train.agents.runner import run_method

    recipe = replace(recipe, backend=replace(recipe.backend, base_urls=[url]))
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    records = run_method(recipe, questions, out, retriever=retriever, progress=False)
    wall = time.perf_counter() - start
    total = {key: sum(getattr(r.cost, key) for r in records) for key in ("calls", "prompt_tokens", "completion_tokens")}
    answers = [r.answer for r in records]
    return {"wall_s": wall, **total, "tokens_per_s": total["completion_tokens"] / wall, "answers": answers}


def warm_up(recipe, url: str) -> None:
    """One short call per route, so adapter loading is not counted in the MAPS run."""
    from maps_train.llm.openai_backend import OpenAIBackend
    from maps_train.llm.types import ChatRequest

    backend = OpenAIBackend(replace(recipe.backend, base_urls=[url]))
    try:
        routes = list({route.adapter: route for route in recipe.roles.values()}.values())
        request = ChatRequest(role="warmup", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
        backend.generate([request] * len(routes), routes)
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--directions", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration (best kept)")
    parser.add_argument("--adapters", help="a folder with proposer/, writer/, consolidator/ (default: B=0 adapters)")
    parser.add_argument("--lora-ops", default="grouped,reference",
                        help="LoRA op sets to run the LoRA server with (MAPS_TRAIN_VLLM_CPU_LORA), comma-separated")
    args = parser.parse_args()

    from maps_train.adapters import distilled_set, with_student_routes
    from maps_train.models import resolve_model
    from maps_train.questions import load_questions
    from maps_train.retrieval.factory import build_retriever
    from maps_train.serve import plan_server
    from maps_train.serve.server import VLLMServer

    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    base = resolve_model(MODEL)
    adapters = Path(args.adapters) if args.adapters else zero_adapters(base, work / "adapters")
    recipe = make_recipe(work, adapters, args)
    questions = load_questions(REPO / "data/demo/test.jsonl", limit=args.questions)
    adapter_recipe = with_student_routes(recipe, distilled_set(recipe), via="server")
    plan = plan_server(recipe)
    print(f"{len(questions)} questions, MAPS N={args.directions}, {args.rounds} rounds, max_tokens {args.max_tokens}, "
          f"{MODEL}, adapters {'B=0 (outputs = base)' if not args.adapters else adapters}, "
          f"max_lora_rank {plan.max_lora_rank}", flush=True)

    retriever = build_retriever(recipe.retrieval)  # built once, outside the timed runs
    from maps_train.llm.vllm_cpu_lora import SWITCH

    ops = [name.strip() for name in args.lora_ops.split(",") if name.strip()]
    servers = [("base server", base_only(plan), [("base", recipe)], None)]
    servers += [(f"lora server ({op})", plan, [(f"lora+base/{op}", recipe), (f"adapters/{op}", adapter_recipe)], op)
                for op in ops]
    results = {}
    for name, server_plan, runs, op in servers:
        if op:
            os.environ[SWITCH] = op  # read by the plugin in the server's engine processes
        start = time.perf_counter()
        with VLLMServer(server_plan, log_path=work / f"{name.replace(' ', '_').strip('()')}.log"):
            print(f"{name}: healthy after {time.perf_counter() - start:.1f}s", flush=True)
            for _ in range(args.repeats):  # alternate the runs on one server; the best of each is kept
                for label, run_recipe in runs:
                    warm_up(run_recipe, plan.url)
                    r = run_maps(run_recipe, plan.url, questions, work / label.replace("/", "-"), retriever)
                    print(f"  {label:18s} wall {r['wall_s']:6.1f}s  calls {r['calls']:4d}  prompt tok "
                          f"{r['prompt_tokens']:6d}  completion tok {r['completion_tokens']:5d}  "
                          f"{r['tokens_per_s']:6.1f} tok/s", flush=True)
                    if label not in results or r["wall_s"] < results[label]["wall_s"]:
                        results[label] = r

    base_run = results["base"]
    for label, r in results.items():
        if label == "base":
            continue
        same = "same answers" if r["answers"] == base_run["answers"] else "answers differ"
        print(f"{label} vs base: wall x{r['wall_s'] / base_run['wall_s']:.2f}, "
              f"tokens/s x{r['tokens_per_s'] / base_run['tokens_per_s']:.2f} ({same})")
    if "adapters/grouped" in results and "adapters/reference" in results:
        speedup = results["adapters/reference"]["wall_s"] / results["adapters/grouped"]["wall_s"]
        print(f"adapters: grouped LoRA ops vs vLLM's reference ops: x{speedup:.2f} faster")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
