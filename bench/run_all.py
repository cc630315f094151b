"""Run every benchmark of the project and print their figures and ratios as one table.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/run_all.py            # all CPU benchmarks, small sizes (~15-25 min)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/run_all.py --only llm agent
    python bench/run_all.py --gpu                                   # adds the GPU LoRA SFT tokens/s + MFU benchmark

Each benchmark is its own script (run it alone for its options); this runner starts them one after another with
sizes that fit a 2-core machine, keeps each one's full output under bench/results/, and prints every line that
reports a figure (throughput, ratio, speed-up, overhead) in one Markdown table. Timings are noisy on shared
machines: compare ratios measured within one run, never across runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "retrieval": ["bench_retrieval.py", "--passages", "128", "--queries", "32", "--clients", "16"],
    "llm": ["bench_llm.py", "--backends", "hf,vllm,openai", "--n", "64", "--max-tokens", "16"],
    "agent": ["bench_agent.py", "--questions", "64", "--rounds", "2", "--top-k", "3", "--passage-words", "40"],
    "train": ["bench_train.py", "--steps", "6", "--repeats", "2"],
    "serve": ["bench_serve.py"],
    "lora_ops": ["bench_lora_ops.py"],
}
GPU_BENCHMARKS = {"gpu_sft_mfu": ["gpu_sft_mfu.py"]}
FIGURE = re.compile(r"(ratio|speed-?up|overhead|tokens/s|queries/s|passages/s|MFU|\d\.\d+x\b|×)", re.IGNORECASE)


def figure_lines(output: str) -> list[str]:
    lines = []
    for line in output.splitlines():
        text = line.strip().strip("|").strip()
        if text and FIGURE.search(text) and re.search(r"\d", text) and not text.startswith(("INFO", "WARNING")):
            lines.append(re.sub(r"\s+", " ", text))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="names among: " + ", ".join([*BENCHMARKS, *GPU_BENCHMARKS]))
    parser.add_argument("--gpu", action="store_true", help="also run the GPU benchmarks")
    args = parser.parse_args()
    chosen = dict(BENCHMARKS)
    if args.gpu:
        chosen.update(GPU_BENCHMARKS)
    if args.only:
        chosen = {name: cmd for name, cmd in {**BENCHMARKS, **GPU_BENCHMARKS}.items() if name in args.only}
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    rows = []
    for name, (script, *options) in chosen.items():
        path = HERE / script
        if not path.exists():
            rows.append((name, "-", f"missing {script}"))
            continue
        print(f"== {name}: {script} {' '.join(options)}", flush=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, str(path), *options], capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        output = done.stdout + ("\n" + done.stderr if done.returncode else "")
        (results_dir / f"{name}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
        if done.returncode != 0:
            rows.append((name, f"{elapsed:.0f}s", f"FAILED (exit {done.returncode}); see bench/results/{name}.log"))
            continue
        figures = figure_lines(output) or ["(no figure lines; see the log)"]
        rows.extend((name, f"{elapsed:.0f}s", line) for line in figures)
    print("\n| benchmark | wall | figure |\n|---|---:|---|")
    for name, wall, line in rows:
        print(f"| {name} | {wall} | {line} |")


if __name__ == "__main__":
    main()
