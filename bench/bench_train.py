"""Training throughput of our entry point (`python -m maps_train.train`) against a plain TRL script, same config.

Both train the same LoRA (r=8, all projections) on the same rows (the toy SFT set's consolidator rows, repeated)
for the same number of steps, each in a fresh process, with and without packing. Throughput is TRL's count of
non-padding training tokens divided by the trainer's `train_runtime`, measured the same way for both; the
overhead ratio is plain / ours (1.0 = no overhead). Wall time per process (imports, data, save) is printed too.
The runs alternate plain/ours and each configuration keeps its best of --repeats (the machine is shared, so the
best run is the least disturbed one); every process uses --threads torch threads.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_train.py                       # SmolLM2-135M, CPU
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_train.py --model builtin:tiny-qwen3 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the hand-written SFT set shared with the tests


def write_data(folder: Path, repeat: int) -> Path:
    """The toy set, rows repeated so the steps do not run out (the builder's metadata columns kept)."""
    from toy_sft import toy_rows

    rows = toy_rows()["consolidator"] * repeat
    (folder / "consolidator").mkdir(parents=True, exist_ok=True)
    with (folder / "consolidator" / "train.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return folder


def train_settings(args, packing: bool) -> dict:
    return {
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "learning_rate": 1.0e-4,
        "max_steps": args.steps,
        "per_device_train_batch_size": args.batch_size,
        "max_length": args.max_length,
        "packing": packing,
        "logging_steps": 1,
        "save_steps": 10_000,
        "warmup_steps": 0.0,
        "lr_scheduler_type": "constant",
    }


def run_ours(args, sft_dir: Path, work: Path, packing: bool) -> dict:
    out = work / f"ours-{'packed' if packing else 'padded'}"
    recipe = work / f"recipe-{out.name}.yaml"
    flat = train_settings(args, packing)
    lora = {"r": flat.pop("lora_r"), "lora_alpha": flat.pop("lora_alpha"), "lora_dropout": flat.pop("lora_dropout"),
            "target_modules": "all-linear"}
    settings = {"student": args.model, "sft_dir": str(sft_dir), "output_dir": str(out), "lora": lora, "sft": flat}
    recipe.write_text(yaml.safe_dump({"name": "bench", "train": settings}))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "maps_train.train", "--config", str(recipe), "--role", "consolidator"],
        cwd=REPO, check=True, capture_output=not args.verbose,
    )
    wall = time.perf_counter() - start
    summary = json.loads((out / "consolidator" / "train_summary.json").read_text())
    trainer_metrics = json.loads((out / "_trainer" / "consolidator" / "train_results.json").read_text())
    return {"tokens": summary["train_tokens"], "runtime": trainer_metrics["train_runtime"], "wall": wall}


def run_plain(args, sft_dir: Path, work: Path, packing: bool) -> dict:
    out = work / f"plain-{'packed' if packing else 'padded'}"
    spec = {"model": args.model, "data": str(sft_dir / "consolidator" / "train.jsonl"), "out": str(out),
            "train": train_settings(args, packing)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, __file__, "--plain-trl", json.dumps(spec)], cwd=REPO, check=True, capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    return {**measured, "wall": wall}


def plain_trl(spec: dict) -> None:
    """What someone would write with TRL's own tools: load JSONL, SFTTrainer with a LoraConfig, train, save."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from maps_train.models import resolve_model

    path = resolve_model(spec["model"])
    train = spec["train"]
    dataset = load_dataset("json", data_files=spec["data"], split="train").remove_columns(["question_id", "role"])
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(path),
        train_dataset=dataset,
        peft_config=LoraConfig(r=train["lora_r"], lora_alpha=train["lora_alpha"], lora_dropout=0.0,
                               target_modules="all-linear", task_type="CAUSAL_LM"),
        args=SFTConfig(
            output_dir=spec["out"], learning_rate=train["learning_rate"], max_steps=train["max_steps"],
            per_device_train_batch_size=train["per_device_train_batch_size"], max_length=train["max_length"],
            packing=train["packing"], logging_steps=1, save_strategy="no", bf16=False, use_cpu=True,
            gradient_checkpointing=False, lr_scheduler_type="constant", report_to="none", seed=0,
        ),
    )
    result = trainer.train()
    trainer.save_model(spec["out"])
    tokens = [entry["num_tokens"] for entry in trainer.state.log_history if "num_tokens" in entry][-1]
    print(json.dumps({"tokens": int(tokens), "runtime": result.metrics["train_runtime"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=4, help="copies of the toy rows")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration; the best is kept")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every training process")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--plain-trl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_trl:
        plain_trl(json.loads(args.plain_trl))
        return

    from maps_train.platform import apply_runtime_defaults

    apply_runtime_defaults(offline=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from maps_train.models import resolve_model

    resolve_model(args.model)  # materialise once, outside the timings
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        sft_dir = write_data(work / "sft", args.repeat)
        for packing in (False, True):
            for name in ("plain TRL", "maps_train.train"):
                rows.append([packing, name, 0, float("inf"), 0.0, float("inf")])
            for repeat in range(args.repeats):
                for row, runner in zip(rows[-2:], (run_plain, run_ours)):
                    measured = runner(args, sft_dir, work / f"r{repeat}", packing)
                    rate = measured["tokens"] / measured["runtime"]
                    print(f"  packing={packing} {row[1]} run {repeat + 1}: {rate:.0f} tokens/s", file=sys.stderr)
                    if rate > row[4]:
                        row[2:5] = measured["tokens"], measured["runtime"], rate
                    row[5] = min(row[5], measured["wall"])

    print(
        f"\nmodel {args.model}, {args.steps} steps, batch {args.batch_size}, max_length {args.max_length}, CPU, "
        f"{args.threads} thread(s), best of {args.repeats}"
    )
    print(f"{'packing':<8} {'script':<18} {'tokens':>8} {'train s':>8} {'tokens/s':>9} {'wall s':>7}")
    for packing, name, tokens, runtime, rate, wall in rows:
        print(f"{packing!s:<8} {name:<18} {tokens:>8} {runtime:>8.2f} {rate:>9.0f} {wall:>7.1f}")
    for packing in (False, True):
        plain, ours = [r for r in rows if r[0] == packing]
        print(f"packing={packing}: overhead ratio plain/ours tokens/s = {plain[4] / ours[4]:.3f}")
    padded, packed = rows[1][4], rows[3][4]
    print(f"packing speed-up (ours): {packed / padded:.2f}x tokens/s")


if __name__ == "__main__":
    main()
