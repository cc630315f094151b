"""One forward pass's multi-LoRA work on vLLM-CPU, op by op: vLLM's reference ops vs maps-train's (the plugin).

    .venv/bin/python bench/bench_lora_ops.py                       # SmolLM2-135M shapes, r=16, 3 adapters
    .venv/bin/python bench/bench_lora_ops.py --model Qwen/Qwen3-0.6B --rank 32 --dtype bfloat16

Replays the calls vLLM's CPU punica wrapper makes in one forward pass (`add_lora_linear` on every layer's
qkv, o, gate_up and down projections: one shrink into a float32 buffer per output slice, then one expand per
slice into the projection's output), with the model's real shapes, for decode batches (one token a sequence,
`bgmv_*`) and a prefill batch (`sgmv_*`), mixed across adapters or on one. The base projections' GEMMs on the
same inputs are timed beside them, so each figure is also a share of the base model's own matmul time. The
weights are random (speed does not depend on their values). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib
import time
from functools import partial

import torch

OPS = {"reference": "vllm.lora.ops.torch_ops", "maps-train": "maps_train.llm.vllm_cpu_lora"}


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


def lora_pass(ops, layer: Layer, layers: int, indices: torch.Tensor | None, prefill) -> None:
    """What PunicaWrapperCPU.add_lora_linear does on every projection of `layers` layers."""
    for _ in range(layers):
        for name, (_, outs) in layer.shapes.items():
            x = layer.inputs[name]
            y = torch.empty(x.shape[0], sum(outs), dtype=x.dtype)
            buffers = [torch.zeros(x.shape[0], layer.a[name][0].shape[2], dtype=torch.float32) for _ in outs]
            for buffer, a in zip(buffers, layer.a[name]):
                if prefill is None:
                    ops.bgmv_shrink(x, a, buffer, indices, 2.0)
                else:
                    ops.sgmv_shrink(x, a, buffer, *prefill, 2.0)
            offset = 0
            for buffer, b, out in zip(buffers, layer.b[name], outs):
                if prefill is None:
                    ops.bgmv_expand_slice(buffer, b, y, indices, offset, out, True)
                else:
                    ops.sgmv_expand_slice(buffer, b, y, *prefill, offset, out, True)
                offset += out


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
    modules = {label: importlib.import_module(path) for label, path in OPS.items()}
    print(f"{args.model}: {layers} layers, {shapes}, rank {args.rank}, {args.adapters} adapters, {dtype}, "
          f"{torch.get_num_threads()} threads; one forward pass's LoRA ops (best of {args.repeats})", flush=True)

    sequences, length = (int(v) for v in args.prefill.split("x"))
    cases = []
    for rows in (int(v) for v in args.decode.split(",")):
        cases.append((f"decode {rows} seqs, mixed", rows, torch.arange(rows) % args.adapters, None))
        cases.append((f"decode {rows} seqs, one adapter", rows, torch.zeros(rows, dtype=torch.long), None))
    lengths = torch.full((sequences,), length)
    per_sequence = torch.arange(sequences) % args.adapters
    starts = torch.cumsum(lengths, 0) - lengths
    prefill = (starts, lengths, per_sequence, sequences, length, sequences * length)
    cases.append((f"prefill {sequences}x{length} tokens, mixed", sequences * length, None, prefill))

    for label, rows, indices, prefill_args in cases:
        layer = Layer(shapes, args.rank, slots, rows, dtype)
        base = best_ms(partial(base_pass, layer, layers), args.repeats)
        times = {name: best_ms(partial(lora_pass, ops, layer, layers, indices, prefill_args), args.repeats)
                 for name, ops in modules.items()}
        cells = "  ".join(f"{name} {ms:8.1f} ms ({ms / base:4.2f}x base)" for name, ms in times.items())
        print(f"{label:32s} base GEMMs {base:8.1f} ms  {cells}  "
              f"speed-up x{times['reference'] / times['maps-train']:.2f}", flush=True)


if __name__ == "__main__":
    main()
