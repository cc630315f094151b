"""LoRA SFT throughput and MFU of a randomly initialised Qwen3-4B (real shapes, no weights) on one GPU.

The trainer path is the real one (TRL `SFTTrainer` + PEFT LoRA r=64 on every projection, bf16, completion-only
loss, gradient checkpointing), fed pre-tokenised synthetic rows whose lengths look like role calls; it runs once
padded and once packed (TRL's BFD packing, padding-free). Throughput counts non-padding tokens (TRL's
`num_tokens`) over the steps after a warm-up.

FLOPs per trained token (model FLOPs, the PaLM convention: recomputation from checkpointing not counted,
attention not halved for causality):
    4 * N_frozen          frozen matmul weights (every projection + lm_head): forward 2N, backward 2N for the
                          input gradient only (no weight gradient for frozen weights)
  + 6 * N_lora            LoRA A/B: forward 2N, backward 4N (input and weight gradients)
  + 12 * L * d_attn * s   attention scores and values, forward 4*L*d_attn*s, backward twice that, where s is the
                          length of the token's own document (token-weighted mean E[s^2]/E[s]; with padding-free
                          packing a token attends only within its document)
with L layers, d_attn = heads * head_dim, embedding lookups free. MFU = counted FLOPs/s / peak (989 TFLOP/s dense
bf16 for an H100 SXM; H200 has the same tensor cores). Padding tokens are not counted: they are the waste packing
removes. Note: packing is only cheaper in attention with a varlen kernel (flash-attention); under SDPA the
padding-free batch is masked block-diagonally but still computed at the packed length.

    python bench/gpu_sft_mfu.py                      # on a GPU: padded and packed, Qwen3-4B shapes
    python bench/gpu_sft_mfu.py --dry-run            # anywhere: the FLOP accounting of the real shapes, no training
    python bench/gpu_sft_mfu.py --tiny               # on CPU: the same code path on a 2-layer model (smoke test)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

QWEN3_4B = dict(
    hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
)
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=2048, tie_word_embeddings=True, max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
H100_BF16_DENSE_TFLOPS = 989.0


def qwen3_config(shapes: dict):
    from transformers import Qwen3Config

    return Qwen3Config(**shapes)


def parameter_counts(config, rank: int) -> dict[str, int]:
    """Matmul weights of the frozen base (lm_head included even when tied) and of the LoRA adapters, exactly, from a
    weightless (meta-device) instance."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    frozen = lora = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            frozen += module.in_features * module.out_features
            if name.split(".")[-1] in TARGETS:
                lora += rank * (module.in_features + module.out_features)
    embedding = model.get_input_embeddings().weight.numel()
    return {"frozen_matmul": frozen, "lora": lora, "embedding": embedding}


def flops_per_token(config, counts: dict[str, int], mean_doc_len: float) -> float:
    d_attn = config.num_attention_heads * config.head_dim
    attention = 12 * config.num_hidden_layers * d_attn * mean_doc_len
    return 4 * counts["frozen_matmul"] + 6 * counts["lora"] + attention


def synthetic_rows(n_docs: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[dict]:
    """Pre-tokenised prompt-completion rows (the last ~25% of each is the completion, as in role calls)."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n_docs):
        length = rng.randint(min_len, max_len)
        completion = max(1, length // 4)
        rows.append(
            {
                "input_ids": [rng.randrange(3, vocab) for _ in range(length)],
                "completion_mask": [0] * (length - completion) + [1] * completion,
            }
        )
    return rows


def token_weighted_length(rows: list[dict]) -> float:
    lengths = [len(r["input_ids"]) for r in rows]
    return sum(s * s for s in lengths) / sum(lengths)


class SteadyStateTimer:
    """Tokens and seconds between the end of the warm-up step and the last step (TRL's `num_tokens` count)."""

    def __init__(self, warmup: int):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "num_tokens" in logs:
                    timer.marks.append((state.global_step, time.perf_counter(), int(logs["num_tokens"])))

        self.warmup = warmup
        self.marks: list[tuple[int, float, int]] = []
        self.callback = _Callback()

    def measure(self) -> tuple[int, float]:
        start = next(m for m in self.marks if m[0] >= self.warmup)
        end = self.marks[-1]
        return end[2] - start[2], end[1] - start[1]


def train_run(args, shapes: dict, rows: list[dict], packing: bool) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    config = qwen3_config(shapes)
    config.pad_token_id, config.eos_token_id = 0, 1
    attn = args.attn or ("flash_attention_2" if cuda and _has_flash_attn() else "sdpa")
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    # The trainer needs a tokenizer object for the pad id only; the rows are already token ids.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>")),
        pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
    )
    timer = SteadyStateTimer(args.warmup)
    trainer = SFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=TARGETS,
                               task_type="CAUSAL_LM"),
        args=SFTConfig(
            output_dir=args.output_dir, max_steps=args.warmup + args.steps, logging_steps=1, save_strategy="no",
            per_device_train_batch_size=args.batch_size, max_length=args.max_length, packing=packing,
            bf16=cuda, use_cpu=not cuda, gradient_checkpointing=args.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False}, learning_rate=1e-4, report_to="none",
            completion_only_loss=True, dataloader_num_workers=0, seed=0,
        ),
        callbacks=[timer.callback],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    tokens, seconds = timer.measure()
    result = {
        "packing": packing,
        "attn": attn,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": tokens / seconds,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
    }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result


def _has_flash_attn() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the FLOP accounting only (no GPU needed)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on whatever device there is")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--min-doc", type=int, default=256, help="shortest synthetic row (tokens)")
    parser.add_argument("--max-doc", type=int, default=2048, help="longest synthetic row (tokens)")
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--attn", default=None, help="attn_implementation (default: flash_attention_2 if installed)")
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    parser.add_argument("--output-dir", default="/tmp/gpu_sft_mfu")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch

    shapes = TINY if args.tiny else QWEN3_4B
    if args.tiny:
        args.batch_size, args.max_length, args.min_doc, args.max_doc = 4, 256, 32, 200
        args.docs, args.warmup, args.steps, args.rank = 64, 1, 3, 8
    config = qwen3_config(shapes)
    counts = parameter_counts(config, args.rank)
    rows = synthetic_rows(args.docs, args.min_doc, args.max_doc, config.vocab_size, seed=0)
    mean_len = token_weighted_length(rows)
    per_token = flops_per_token(config, counts, mean_len)
    print(
        f"{'tiny' if args.tiny else 'Qwen3-4B'} shapes: frozen matmul params {counts['frozen_matmul'] / 1e6:,.2f} M, "
        f"LoRA r={args.rank} params {counts['lora'] / 1e6:,.2f} M, embedding {counts['embedding'] / 1e6:,.2f} M; "
        f"token-weighted row length {mean_len:.0f}; {per_token / 1e9:.4g} GFLOP per trained token"
    )
    if args.dry_run:
        return 0
    if not torch.cuda.is_available() and not args.tiny:
        print("gpu_sft_mfu: no CUDA device; this benchmark needs one GPU (use --dry-run or --tiny here)",
              file=sys.stderr)
        return 2

    results = []
    for packing in (False, True):
        result = train_run(args, shapes, rows, packing)
        flops_per_s = result["tokens_per_second"] * per_token
        result["tflops_per_s"] = flops_per_s / 1e12
        result["mfu"] = flops_per_s / (args.peak_tflops * 1e12) if torch.cuda.is_available() else None
        results.append(result)

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"\n{device}; batch {args.batch_size}, max_length {args.max_length}, LoRA r={args.rank}, "
          f"gradient checkpointing {args.gradient_checkpointing}, peak {args.peak_tflops:.0f} TFLOP/s")
    print(f"{'packing':<8} {'attn':<18} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}")
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['packing']!s:<8} {r['attn']:<18} {r['tokens_per_second']:>10.0f} {r['tflops_per_s']:>8.1f} "
              f"{mfu:>6} {r['peak_memory_gib'] or '-'!s:>9}")
    print(f"packing speed-up: {results[1]['tokens_per_second'] / results[0]['tokens_per_second']:.2f}x tokens/s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "params": counts, "flops_per_token": per_token, "runs": results}, handle,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
