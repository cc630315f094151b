"""bench/gpu_day_one.sh, the one prepared device check of issue 47: what a CPU can check of it. The script's
commands (installing the GPU set from a wheelhouse, offline, then the bounded measurement), and the planned column
of its table, which must be `maps-train plan`'s own figures for the same settings. The measured column needs a GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from maps_train.plan import memory
from maps_train.plan.shapes import model_shape

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_day_one.sh"


def test_the_script_installs_the_gpu_set_from_carried_wheels_then_measures_within_ten_minutes():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    out = subprocess.run([str(SCRIPT), "--dry-run", "--wheels", "/carried/wheels"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "+ python3 -m venv .venv-gpu"
    assert out[1] == "+ .venv-gpu/bin/pip install --quiet --no-index --find-links /carried/wheels -e .[gpu]"
    assert out[-1].endswith("timeout 540 .venv-gpu/bin/python bench/gpu_day_one.py --json "
                            "runs/gpu_day_one/gpu_day_one.json")
    extra = subprocess.run([str(SCRIPT), "--dry-run", "--extra", "gpu-faiss", "--no-install"], capture_output=True,
                           text=True, check=True).stdout
    assert "pip install" not in extra and "gpu_day_one.py" in extra
    bad = subprocess.run([str(SCRIPT), "--dry-run", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("gpu_day_one.sh: unknown option --bogus")


def test_the_planned_column_is_the_plans_own_figures():
    """Each planned figure recomputed here from plan.memory with the distill recipes' settings: LoRA r64, dropout
    0.05, checkpointing, bf16, one rank; the engine at 0.85 of a 141 GB H200; wiki-scale FAISS in fp32 on a large
    host and fp16 on a small one."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_day_one.py"), "--plan-only", "--gpu-memory-gb",
                          "141", "--host-memory-gb", "1000"], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    rows = {line.split("  ")[0]: line for line in out.splitlines()[2:]}
    for name, model, batch in (("0.6B", "Qwen/Qwen3-0.6B", 8), ("0.6B", "Qwen/Qwen3-0.6B", 32),
                               ("1.7B", "Qwen/Qwen3-1.7B", 8), ("4B", "Qwen/Qwen3-4B", 8)):
        need = memory.train_memory(model_shape(model), batch=batch, max_length=4096, lora_rank=64, lora_dropout=0.05,
                                   checkpointing=True, bf16=True, world=1, zero_stage=0).total
        row = rows[f"train Qwen3-{name} LoRA r64, {batch} x 4096, checkpointing"]
        assert f" {need / 1e9:.1f} GB " in row and row.rstrip().endswith("-")
    assert " 36.3 GB " in rows["train Qwen3-0.6B LoRA r64, 32 x 4096, checkpointing"]  # issue 47's case
    engine = next(line for key, line in rows.items() if key.startswith("vLLM Qwen3-0.6B"))
    assert f" {0.85 * 141:.1f} GB " in engine
    assert rows[next(key for key in rows if key.startswith("FAISS"))].split()[-3] == "fp32"
    small = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_day_one.py"), "--plan-only",
                            "--host-memory-gb", "4"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert small.splitlines()[-1].split()[-3] == "fp16"  # 1M x 768 x 4 = 3.1 GB: over half of 4 GB


def test_off_a_gpu_the_measurement_refuses_and_the_plan_still_prints():
    refused = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_day_one.py")], capture_output=True, text=True,
                             cwd=REPO)
    assert refused.returncode == 2 and "no CUDA device" in refused.stderr
    assert subprocess.run([sys.executable, str(REPO / "bench" / "gpu_day_one.py"), "--plan-only"], capture_output=True,
                          cwd=REPO).returncode == 0
