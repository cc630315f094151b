"""What `rl.decoding: deployed` costs the policy's calls on the trainer's model (`rl.rollout: hf`): the same
consolidator prompts drawn by `ModelSampler` free (temperature 1, no schema), sampled under the consolidator's
JSON schema (the branch call), and greedy under it (every other policy call), with SmolLM2-135M-Instruct on the
CPU. Prints seconds per call, tokens per call, tokens per second, the share of outputs that parse, and the ratios
to free sampling; nothing is asserted (these machines are noisy: compare ratios from one run).

    .venv/bin/python bench/bench_rl_decoding.py [--calls 12] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import time

from maps_train.platform import apply_runtime_defaults

apply_runtime_defaults(offline=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maps_train.agents.outputs import consolidation_schema, parse_consolidation
    from maps_train.llm.types import ChatRequest
    from maps_train.models import resolve_model
    from maps_train.recipe import RoleRoute
    from maps_train.rl.policy import ModelSampler, PolicyBackend, Sampling

    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = resolve_model("builtin:smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    passages = "\n".join(f"[{i}] Passage {i}: the river Stulke flows through the town of Veivvumere, founded in "
                         f"{1800 + i}." for i in range(8))
    prompt = ("Read the evidence and answer in JSON with keys observation, state and sufficient.\n"
              f"Question: Which river flows through the town where The Stendfu Tide was formed?\n{passages}")
    requests = [ChatRequest(role="consolidator", messages=[{"role": "user", "content": prompt}],
                            json_schema=consolidation_schema(), question_id=f"q{i}", seed=100 + i)
                for i in range(args.calls)]
    sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens)
    modes = {
        "free, T=1 (rl.decoding: free)": ("free", RoleRoute(structured=False, max_tokens=args.max_tokens), True),
        "schema, T=1 (the branch call)": ("deployed", RoleRoute(structured=True, max_tokens=args.max_tokens), True),
        "schema, greedy (later calls)": ("deployed", RoleRoute(structured=True, max_tokens=args.max_tokens), False),
    }
    results = {}
    for name, (decoding, route, explore) in modes.items():
        policy = PolicyBackend(ModelSampler(lambda: model, tokenizer), tokenizer, sampling, 2048, decoding=decoding)
        policy.generate(requests[:1], [route])  # warm-up (and the grammar's compile)
        policy.samples.clear()
        if explore:
            policy.explore = {r.question_id for r in requests}
        start = time.perf_counter()
        completions = policy.generate(requests, [route] * len(requests))
        seconds = time.perf_counter() - start
        tokens = sum(c.completion_tokens for c in completions)
        parsed = sum(parse_consolidation(c.text, previous_state="", fallback_observation="").ok for c in completions)
        results[name] = {"s_per_call": seconds / len(requests), "tokens_per_call": tokens / len(requests),
                         "tokens_per_s": tokens / seconds, "parsed": f"{parsed}/{len(requests)}"}
    base = next(iter(results.values()))
    print(f"{args.calls} consolidator calls, at most {args.max_tokens} tokens, SmolLM2-135M-Instruct, CPU "
          f"({torch.get_num_threads()} threads)")
    print(f"{'mode':34} {'s/call':>7} {'tok/call':>8} {'tok/s':>7} {'parsed':>7} {'x s/call':>9} {'x tok/s':>8}")
    for name, row in results.items():
        print(f"{name:34} {row['s_per_call']:7.2f} {row['tokens_per_call']:8.1f} {row['tokens_per_s']:7.1f} "
              f"{row['parsed']:>7} {row['s_per_call'] / base['s_per_call']:9.2f} "
              f"{row['tokens_per_s'] / base['tokens_per_s']:8.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
