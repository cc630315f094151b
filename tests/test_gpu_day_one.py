"""bench/gpu_day_one.py, the day-one check for the lent GPU machine (issues 47, 63): what a CPU can check of it.
The script's commands (no install of the GPU set: the carried wheelhouse only), the planned column (the plan's own
figures for the same settings), and one case of the CPU rehearsal end to end in a fresh process: an SFT row on the
tiny model through TRL's real SFTTrainer, with every other row skipped and its reason in the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from maps_train.plan import memory
from maps_train.plan.shapes import model_shape

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_day_one.sh"
CHECK = REPO / "bench" / "gpu_day_one.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_the_script_installs_only_the_carried_wheelhouse_then_measures_within_ten_minutes():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    out = subprocess.run([str(SCRIPT), "--dry-run", "--wheels", "/carried/wheels"], capture_output=True, text=True,
                         check=True).stdout
    assert "venv" not in out and ".[gpu]" not in out  # the GPU set (4.4 GB) does not travel
    assert out.splitlines()[-1].endswith("timeout 570 python3 bench/gpu_day_one.py --wheels /carried/wheels --json "
                                         "runs/gpu_day_one/gpu_day_one.json")
    bad = subprocess.run([str(SCRIPT), "--dry-run", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("gpu_day_one.sh: unknown option --bogus")


def test_the_planned_column_is_the_plans_own_figures(tmp_path):
    """Each SFT row's planned figure recomputed here from plan.memory with the distill recipes' settings (LoRA r64,
    dropout 0.05, bf16, one rank, 8 x 4096) with and without checkpointing; without it, on an 80 GB GPU, the batch
    is the largest power of two the plan fits in 72 GB."""
    out = tmp_path / "plan.json"
    subprocess.run([sys.executable, str(CHECK), "--plan-only", "--gpu-memory-gb", "80", "--json", str(out)],
                   check=True, cwd=REPO, env=ENV, capture_output=True)
    rows = {row["id"]: row for row in json.loads(out.read_text())["rows"]}
    assert all(row["status"] == "skipped" and row["reason"] == "plan only" for row in rows.values())
    for name, model in (("0.6b", "Qwen/Qwen3-0.6B"), ("1.7b", "Qwen/Qwen3-1.7B"), ("4b", "Qwen/Qwen3-4B")):
        for checkpointing in (True, False):
            row = rows[f"sft-qwen3-{name}-{'ckpt' if checkpointing else 'nockpt'}"]
            batch = row["batch"]
            need = memory.train_memory(model_shape(model), batch=batch, max_length=4096, lora_rank=64,
                                       lora_dropout=0.05, checkpointing=checkpointing, bf16=True, world=1,
                                       zero_stage=0).total
            assert row["planned"] == need
            assert batch == 8 if checkpointing else (need <= 72e9 and batch < 8)
    assert rows["context"]["planned"] == 1e9 and rows["vllm-engine"]["planned"] == 0.85 * 80e9


def test_the_rehearsal_measures_one_sft_row_in_a_fresh_process_and_says_why_the_rest_are_skipped(tmp_path):
    out = tmp_path / "day_one.json"
    done = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--tiny", "--steps", "1", "--only",
                           "sft-qwen3-0.6b-ckpt", "--only", "vllm", "--only", "grpo-colocated", "--only", "context", "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {row["id"]: row for row in report["rows"]}
    assert list(rows) == ["context", "sft-qwen3-0.6b-ckpt", "vllm-engine", "vllm-teacher", "grpo-colocated"]
    sft = rows["sft-qwen3-0.6b-ckpt"]
    assert sft["status"] == "measured", sft
    assert sft["measured_bytes"] > 0 and sft["measured_what"] == "host: peak RSS of the process"
    assert sft["tokens_per_s"] > 0 and len(sft["step_seconds"]) == 2  # one warm-up step, one timed
    assert sft["flops_per_token"] > 0 and sft["planned"] > 0 and sft["check"].startswith("SFT Qwen3-0.6B (tiny)")
    assert rows["context"] == {**rows["context"], "status": "skipped", "reason": "no CUDA device (CPU run)"}
    for name in ("vllm-engine", "vllm-teacher", "grpo-colocated"):
        assert rows[name]["status"] == "skipped" and rows[name]["reason"]
    assert report["installed"]["trl"] and report["device"] == "cpu"
    table = out.with_suffix(".txt").read_text()
    assert table.splitlines()[0].startswith("check") and len(table.splitlines()) == 6
    assert "== sft-qwen3-0.6b-ckpt" in out.with_suffix(".log").read_text()  # the case's own process's output


def test_off_a_gpu_the_measurement_refuses_and_the_plan_still_prints(tmp_path):
    refused = subprocess.run([sys.executable, str(CHECK), "--json", str(tmp_path / "x.json")], capture_output=True,
                             text=True, cwd=REPO, env=ENV)
    assert refused.returncode == 2 and "no CUDA device" in refused.stderr
    assert subprocess.run([sys.executable, str(CHECK), "--plan-only", "--json", str(tmp_path / "p.json")],
                          capture_output=True, cwd=REPO, env=ENV).returncode == 0


def test_a_wheelhouse_that_cannot_install_is_named_in_every_row_it_costs(tmp_path):
    """pip's own error (offline, from the carried folder) comes back in the record and in the rows that needed the
    package, instead of an uncaught failure and no table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_day_one", CHECK)
    day_one = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(day_one)
    (tmp_path / "wheels").mkdir()
    record = day_one.install_wheelhouse(tmp_path / "wheels", ["no-such-package-63"])
    assert record["installed"] == [] and "no-such-package-63" in record["error"]
    row = {"needs": ["trl", "datasets"]}
    reason = day_one.skip_reason(row, {"trl": None, "datasets": None}, False, record)
    assert reason.startswith("trl is not importable; the wheelhouse did not install: ") and record["error"] in reason
