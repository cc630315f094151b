"""GPU day one: `maps-train plan`'s figures against what one GPU measures, on the GPU machine as it is lent.

The lent machine (docs/install-gpu.md, "GPU day one") has Python 3.12 with torch, transformers, accelerate, peft
and pyarrow, but no trl, datasets, vllm, faiss or deepspeed, and no package index. So this check first finds what
is importable, installs only what is missing and small from a carried wheelhouse (`--wheels`, made here by
bench/gpu_wheelhouse.sh: trl, datasets and their missing dependencies, about 2 MB), then measures each case in a
fresh process (bench/gpu_day_one_cases.py), and always writes its table and JSON: one row per case, measured,
failed with its error, or skipped with the reason (no vLLM there: the serving, teacher and colocated-GRPO rows
say so). No weights are downloaded: every model is built from the shipped config values
(maps_train/plan/models/*.json) with random weights, which allocate exactly as trained ones do.

Rows: the CUDA context of a process (what `llm.pool.ENGINE_CONTEXT_BYTES` estimates); LoRA SFT through TRL's
SFTTrainer of Qwen3-0.6B, 1.7B and 4B at the distill recipes' batch x length (8 x 4096, LoRA r64 on every
projection, completion-only loss, bf16), with and without gradient checkpointing (without it at the largest
batch the plan fits on this GPU where 8 does not), each beside the plan's figure (`plan.memory.train_memory`) and
with tokens/s and MFU; a GRPO policy step through TRL's GRPOTrainer generating with transformers (no vLLM);
FAISS flat search; the vLLM rows where vLLM is importable.

    python3 bench/gpu_day_one.py --wheels .whl            # on the GPU (about 6 minutes on one H200)
    python bench/gpu_day_one.py --device cpu --tiny       # the rehearsal: the same cases on a 2-layer model
    python bench/gpu_day_one.py --plan-only               # anywhere: the planned column only
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GB = 1e9
CASES_SCRIPT = REPO / "bench" / "gpu_day_one_cases.py"
MODULES = ["torch", "transformers", "accelerate", "peft", "trl", "datasets", "pyarrow", "vllm", "faiss", "deepspeed",
           "sentence_transformers"]
DISTRIBUTIONS = {"faiss": "faiss-cpu", "sentence_transformers": "sentence-transformers"}
CARRIED = ["trl", "datasets"]  # small, missing on the lent image: installed from the wheelhouse
SFT_MODELS = ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"]
SFT_BATCH, SFT_LENGTH = 8, 4096  # recipes/distill/qwen3-{0.6b,1.7b,4b}.yaml: train.sft
LORA_RANK, LORA_DROPOUT = 64, 0.05
PEAK_BF16_TFLOPS = 989.0  # dense bf16 of an H100/H200 SXM by NVIDIA's datasheet (measured here: 769-798, KINDS.md)
NO_VLLM = ("vllm is not importable: the lent image has none, and the GPU set's wheels (about 4.4 GB) exceed the "
           "64 MiB a call carries")
ENGINE = dict(model="Qwen/Qwen3-0.6B", adapters=3, max_model_len=8192, utilization=0.85)
FAISS_CASE = dict(passages=1_000_000, dim=768, queries=256, k=10)
TINY_FAISS = dict(passages=20_000, dim=64, queries=64, k=10)


def installed() -> dict[str, str | None]:
    """Each module of interest: its distribution's version where importable, else None."""
    found = {}
    for module in MODULES:
        if importlib.util.find_spec(module) is None:
            found[module] = None
            continue
        try:
            found[module] = importlib.metadata.version(DISTRIBUTIONS.get(module, module))
        except importlib.metadata.PackageNotFoundError:
            found[module] = "importable"
    return found


def install_wheelhouse(wheels: Path | None, missing: list[str]) -> dict:
    """pip installs the missing carried packages from `wheels`, offline, into this interpreter's environment: pip
    keeps every installed requirement that satisfies them and takes only the rest from the folder."""
    record: dict = {"folder": str(wheels) if wheels else None, "missing": missing, "installed": []}
    if wheels is None or not missing:
        return record
    files = sorted(wheels.glob("*.whl"))
    if "faiss-cpu" in missing and not any(f.name.startswith("faiss_cpu-") for f in files):
        missing.remove("faiss-cpu")  # optional: bench/gpu_wheelhouse.sh --faiss carries it
    if not missing:
        return record
    record["wheels"], record["size_bytes"] = [f.name for f in files], sum(f.stat().st_size for f in files)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels),
               "--no-cache-dir", "--no-compile", "--disable-pip-version-check", *missing]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        record["error"] = lines[-1][:300] if lines else f"pip exited with {done.returncode}"
    else:
        record["installed"] = missing
    return record


def planned_sft(model: str, batch: int, length: int, checkpointing: bool, tiny: bool, cuda: bool) -> float:
    """The plan's bytes for one rank (no ZeRO, one machine), every position labelled (its upper bound)."""
    from maps_train.plan import memory
    from maps_train.plan.shapes import model_shape, shape_from_config

    if tiny:
        sys.path.insert(0, str(REPO / "bench"))
        from gpu_day_one_cases import TINY

        shape = shape_from_config(dict(TINY), "tiny", "bench/gpu_day_one_cases.py")
    else:
        shape = model_shape(model)
    return memory.train_memory(shape, batch=batch, max_length=length, lora_rank=LORA_RANK, lora_dropout=LORA_DROPOUT,
                               checkpointing=checkpointing, bf16=cuda, world=1, zero_stage=0, on_gpu=cuda).total


def sft_batch(model: str, checkpointing: bool, gpu_bytes: float) -> int:
    """The recipes' batch, or without checkpointing the largest power of two the plan fits in 90% of the GPU."""
    batch = SFT_BATCH
    while batch > 1 and planned_sft(model, batch, SFT_LENGTH, checkpointing, False, True) > 0.9 * gpu_bytes:
        batch //= 2
    return batch


def cases(args, gpu_bytes: float) -> list[dict]:
    """Every row of the table: its id, label, planned bytes, the case spec run in its own process (None: planned
    only), and what it needs."""
    tiny = args.tiny
    cuda = not tiny  # the plan's figures are a GPU's (bf16, fused head on CUDA) but for the tiny CPU rehearsal
    rows = [dict(id="context", check="CUDA context of one process (plan: llm.pool.ENGINE_CONTEXT_BYTES)",
                 planned=_engine_context(), spec={"case": "context"}, needs=["cuda"], timeout=60)]
    for model in SFT_MODELS:
        name = model.split("/")[1]
        for checkpointing in (True, False):
            batch = sft_batch(model, checkpointing, gpu_bytes) if not tiny else 2
            length = SFT_LENGTH if not tiny else 128
            note = "" if batch == SFT_BATCH or tiny else f" (8 needs {planned_sft(model, 8, length, False, False, True) / GB:.0f} GB)"
            rows.append(dict(
                id=f"sft-{name.lower()}-{'ckpt' if checkpointing else 'nockpt'}", batch=batch, length=length,
                check=f"SFT {name}{' (tiny)' if tiny else ''} LoRA r64, {batch} x {length}{note}, "
                      f"checkpointing {'on' if checkpointing else 'off'}",
                planned=planned_sft(model, batch, length, checkpointing, tiny, cuda),
                spec=dict(case="sft", model=model, batch=batch, length=length, checkpointing=checkpointing,
                          steps=args.steps or (1 if tiny else 3)),
                needs=["trl", "datasets"], timeout=150 if not tiny else 300))
    rows.append(dict(id="grpo-policy", check=f"GRPO policy step Qwen3-0.6B{' (tiny)' if tiny else ''}: TRL "
                     "GRPOTrainer, transformers generate (no vLLM)", planned=None,
                     spec=dict(case="grpo", model="Qwen/Qwen3-0.6B", batch=8 if not tiny else 4, generations=4,
                               prompt=1024 if not tiny else 16, completion=128 if not tiny else 8,
                               steps=args.steps or (1 if tiny else 2)),
                     needs=["trl", "datasets"], timeout=150 if not tiny else 300))
    rows.append(dict(id="vllm-engine", check=f"vLLM {ENGINE['model'].split('/')[1]} + 3 LoRA r64 at "
                     f"{ENGINE['utilization']} (serving, traces)", planned=ENGINE["utilization"] * gpu_bytes,
                     spec=dict(case="engine", **ENGINE), needs=["vllm", "cuda"], timeout=240))
    rows.append(dict(id="vllm-teacher", check="vLLM teacher Qwen3-32B tp 4 (traces)", planned=None, spec=None,
                     needs=["vllm", "cuda"], reason="needs 4 GPUs; the lent machine has one"))
    rows.append(dict(id="grpo-colocated", check="GRPO with TRL's colocated vLLM engine (vllm_mode colocate)",
                     planned=None, spec=None, needs=["vllm", "cuda"],
                     reason="not measured here: run `maps-train rl` on the GPU set"))
    case = TINY_FAISS if tiny else FAISS_CASE
    rows.append(dict(id="faiss", check=f"FAISS flat {case['passages']:,} x {case['dim']} in host memory", planned=None,
                     spec=dict(case="faiss", **case), needs=["faiss"], timeout=240))
    return rows


def _engine_context() -> float:
    from maps_train.llm.pool import ENGINE_CONTEXT_BYTES

    return ENGINE_CONTEXT_BYTES


def skip_reason(row: dict, have: dict[str, str | None], cuda: bool, wheelhouse: dict) -> str | None:
    for need in row["needs"]:
        if need == "cuda" and not cuda:
            return "no CUDA device (CPU run)"
        if need == "vllm" and not have.get("vllm"):
            return NO_VLLM
        if need == "faiss" and not have.get("faiss"):
            return ("faiss is not importable (not on the lent image; bench/gpu_wheelhouse.sh --faiss carries "
                    "faiss-cpu's wheel, 18 MB)")
        if need not in ("cuda",) and not have.get(need):
            if wheelhouse.get("error"):
                return f"{need} is not importable; the wheelhouse did not install: {wheelhouse['error']}"
            return f"{need} is not importable and no wheelhouse installed it (--wheels DIR)"
    return row.get("reason")


def run_case(row: dict, spec: dict, timeout: float, log) -> dict:
    """The case in a fresh process: its ROW line, else why none came."""
    command = [sys.executable, str(CASES_SCRIPT), json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as err:
        log.write(f"== {row['id']} (timed out)\n{err.stdout or ''}{err.stderr or ''}\n")
        return {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    log.write(f"== {row['id']}\n{done.stdout[-20000:]}{done.stderr[-20000:]}\n")
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if lines:
        return json.loads(lines[-1][4:])
    tail = [line for line in done.stderr.splitlines() if line.strip()]
    return {"status": "failed", "reason": f"exit {done.returncode}: {tail[-1][:200] if tail else 'no output'}"}


def finish(row: dict, result: dict, cuda: bool, peak_tflops: float) -> dict:
    """The row's printed columns from its result."""
    out = {key: value for key, value in row.items() if key not in ("spec", "needs", "timeout")}
    out.update(result)
    measured = result.get("measured_bytes")
    out["measured"] = f"{measured / GB:.2f} GB" if measured is not None else "-"
    out["ratio"] = (f"{measured / row['planned']:.2f}" if measured is not None and row["planned"] and cuda else "-")
    if "tokens_per_s" in result:
        out["tokens/s"] = f"{result['tokens_per_s']:,.0f}"
        if cuda:
            out["mfu"] = result["tokens_per_s"] * result["flops_per_token"] / (peak_tflops * 1e12)
            out["MFU"] = f"{100 * out['mfu']:.1f}%"
    if "seconds_per_step" in result:
        out["tokens/s"] = f"{result['seconds_per_step']:.2f} s/step"
    if "queries_per_s" in result:
        out["measured"] = ", ".join(f"{k} {v:,.0f} q/s" for k, v in result["queries_per_s"].items())
    if "kv_tokens" in result and result["kv_tokens"]:
        out["tokens/s"] = f"KV {result['kv_tokens']:,} tokens, start {result['start_seconds']:.0f} s"
    return out


COLUMNS = [("check", "check"), ("planned", "planned"), ("measured", "measured"), ("ratio", "measured/planned"),
           ("tokens/s", "tokens/s"), ("MFU", "MFU"), ("status", "status")]


def format_table(rows: list[dict]) -> str:
    cells = [[label for _, label in COLUMNS]]
    for row in rows:
        planned = f"{row['planned'] / GB:.2f} GB" if row.get("planned") else "-"
        status = row["status"] + (f": {row['reason']}" if row.get("reason") else "")
        cells.append([row["check"], planned, row.get("measured", "-"), row.get("ratio", "-"), row.get("tokens/s", "-"),
                      row.get("MFU", "-"), status])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
                     for line in cells) + "\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--tiny", action="store_true", help="2-layer models, short rows (the CPU rehearsal)")
    parser.add_argument("--plan-only", action="store_true", help="the planned column only, nothing run")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="a wheelhouse to install missing trl/datasets from, offline (bench/gpu_wheelhouse.sh)")
    parser.add_argument("--only", action="append", default=None, help="run only rows whose id starts with this")
    parser.add_argument("--steps", type=int, default=None, help="timed steps a training case (one warm-up more)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting cases after this many seconds")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="default: this GPU's")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_BF16_TFLOPS)
    parser.add_argument("--json", type=Path, default=REPO / "runs" / "gpu_day_one" / "gpu_day_one.json")
    args = parser.parse_args()
    start = time.monotonic()

    have = installed()
    cuda = False
    if not args.plan_only and have["torch"]:
        import torch

        cuda = torch.cuda.is_available()
        if args.device == "cuda" and not cuda or args.device == "auto" and not cuda:
            print("gpu_day_one: no CUDA device; run with --device cpu --tiny (the rehearsal) or --plan-only",
                  file=sys.stderr)
            return 2
    args.device = "cuda" if cuda else "cpu"
    gpu_bytes = (args.gpu_memory_gb * GB if args.gpu_memory_gb else
                 float(torch.cuda.get_device_properties(0).total_memory) if cuda else 80 * GB)
    wheelhouse = {}
    if not args.plan_only:
        missing = [name for name in CARRIED if not have.get(name)] + ([] if have.get("faiss") else ["faiss-cpu"])
        wheelhouse = install_wheelhouse(args.wheels, missing)
        have = installed() if wheelhouse.get("installed") else have
    rows = cases(args, gpu_bytes)
    if args.only:
        rows = [row for row in rows if any(row["id"].startswith(prefix) for prefix in args.only)]
    report = {"device": args.device, "tiny": args.tiny, "gpu_bytes": gpu_bytes if cuda else None,
              "installed": have, "wheelhouse": wheelhouse, "python": sys.version.split()[0], "rows": []}
    table_path = args.json.with_suffix(".txt")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with open(args.json.with_suffix(".log"), "w", encoding="utf-8") as log:
        for row in rows:
            reason = None if not args.plan_only else "plan only"
            reason = reason or skip_reason(row, have, cuda, wheelhouse) or (None if row["spec"] else "planned only")
            left = args.budget_s - (time.monotonic() - start)
            if reason is None and left < 30:
                reason = f"out of the check's {args.budget_s:.0f} s budget"
            if reason is not None:
                result = {"status": "skipped", "reason": reason}
            else:
                spec = dict(row["spec"], device=args.device, tiny=args.tiny)
                result = run_case(row, spec, min(row["timeout"], left), log)
                log.flush()
            report["rows"].append(finish(row, result, cuda, args.peak_tflops))
            report["seconds"] = round(time.monotonic() - start, 1)
            write(args.json, json.dumps(report, indent=1) + "\n")
            write(table_path, format_table(report["rows"]))
    if wheelhouse.get("folder"):
        size = wheelhouse.get("size_bytes", 0) / 2**20
        print(f"wheelhouse {wheelhouse['folder']}: {size:.1f} MiB; installed {wheelhouse.get('installed') or 'nothing'}"
              + (f"; error: {wheelhouse['error']}" if wheelhouse.get("error") else ""))
    versions = ", ".join(f"{name} {version}" for name, version in have.items() if version)
    print(f"{args.device}{' (tiny)' if args.tiny else ''}, Python {report['python']}: {versions}; "
          f"{report.get('seconds', 0):.0f} s\n" + format_table(report["rows"]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
