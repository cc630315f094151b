"""Training as a cluster job runs it, on CPU: a run SIGKILLed after a checkpoint resumes from it, DeepSpeed ZeRO-2
and ZeRO-3 train through `maps-train train --accelerate-config`, and a two-machine job (two `maps-train train
--num-machines 2 --machine-rank R` "machines" on one host, one rank each) trains the same adapter as one machine
with two ranks.

Every run is the real launcher on the tiny Qwen3 with the shared adapter (one adapter per launch) and a few steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_train import REPO, run, sft_dir, trainer_record, write_recipe  # noqa: F401 (sft_dir is a fixture)

from maps_train.platform import free_port
from maps_train.train.adapter_check import check_adapter

pytestmark = pytest.mark.slow

# A tiny-model step takes tens of milliseconds: the kill must land well before the next save (SAVE_STEPS later: a
# kill during a save would leave a partial newest checkpoint) and the end of the run.
SAVE_STEPS = 10
KILL_RUN_STEPS = 40


def train_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def cli_train(recipe: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "maps_train.cli", "train", str(recipe), *flags]


def wait_for(condition, process: subprocess.Popen, timeout: float = 300.0) -> None:
    """Poll until `condition()` holds; fail if the process ends first or the time runs out (a hang, not a verdict)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended (exit {process.returncode}) before the condition held"
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.05)


def kill_job(process: subprocess.Popen) -> None:
    """SIGKILL the process and every descendant at once, as a scheduler ends a job. A kill of the process group is
    not enough: torchrun starts each rank in a session of its own, so the ranks would train on, orphaned."""
    import psutil

    job = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for member in job:
        member.send_signal(signal.SIGKILL)
    process.wait()
    _, still_running = psutil.wait_procs(job[1:], timeout=60)
    assert not still_running, f"not killed: {still_running}"


def whole_checkpoint(folder: Path, ranks: int) -> bool:
    """Every file the Trainer's save writes last is there and whole: rank 0's `trainer_state.json` (JSON) and each
    rank's `rng_state_<rank>.pth` (a zip archive, read to its end). The ranks write these with no barrier between."""
    import zipfile

    try:
        json.loads((folder / "trainer_state.json").read_text())
        for rank in range(ranks):
            with zipfile.ZipFile(folder / f"rng_state_{rank}.pth") as archive:
                if archive.testzip() is not None:
                    return False
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return True


def lora_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


# ---------------------------------------------------------------- kill -9 after a checkpoint, then resume


def test_sigkilled_run_resumes_from_its_last_checkpoint(sft_dir, tmp_path):  # noqa: F811
    """SIGKILL the whole `maps-train train` job (CLI, launcher and both ranks) once its first checkpoint is complete,
    then rerun the same command: it resumes from the newest checkpoint and ends at max_steps."""
    recipe = write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out", shared_adapter=True,
                          sft={"max_steps": KILL_RUN_STEPS, "save_steps": SAVE_STEPS, "eval_strategy": "no"})
    command = cli_train(recipe, "--num-processes", "2")
    checkpoints = tmp_path / "out" / "_trainer" / "shared"
    # trainer_state.json is among the last files a checkpoint writes: its presence means the checkpoint is usable.
    first = checkpoints / f"checkpoint-{SAVE_STEPS}"
    process = subprocess.Popen(command, cwd=REPO, env=train_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: whole_checkpoint(first, ranks=2), process)
    finally:
        kill_job(process)
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "out" / "shared" / "train_summary.json").exists(), "the run finished before the kill"
    last = max((path for path in checkpoints.glob("checkpoint-*") if whole_checkpoint(path, ranks=2)),
               key=lambda path: int(path.name.rsplit("-", 1)[1]))
    killed_at = int(last.name.rsplit("-", 1)[1])
    assert SAVE_STEPS <= killed_at < KILL_RUN_STEPS

    result = run(command)
    assert f"shared: resuming from {last}" in result.stdout + result.stderr
    state = trainer_record(tmp_path / "out", "shared")
    assert state["global_step"] == KILL_RUN_STEPS and (tmp_path / "out" / "shared" / "train_summary.json").is_file()
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, KILL_RUN_STEPS + 1))


# ---------------------------------------------------------------- DeepSpeed ZeRO-2 and ZeRO-3 on two CPU ranks


def cpu_copy_of(config_name: str, folder: Path) -> Path:
    """The shipped accelerate config with `mixed_precision: 'no'`: the files say bf16 for GPUs; on a CPU the recipe
    trains in float32 (train.sft.bf16 unset), and DeepSpeed refuses a bf16 config that the TrainingArguments
    contradict ("ds bf16.enabled=True vs hf bf16=False"). Everything else, the deepspeed_config included, is as
    shipped."""
    config = yaml.safe_load((REPO / "recipes" / "accelerate" / f"{config_name}.yaml").read_text())
    config["mixed_precision"] = "no"
    path = folder / f"{config_name}-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("config_name, stage", [("zero2", 2), ("zero3", 3)])
def test_deepspeed_zero_trains_on_two_cpu_ranks(sft_dir, tmp_path, tiny_qwen3, config_name, stage):  # noqa: F811
    recipe = write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out", shared_adapter=True,
                          sft={"max_steps": 2, "save_steps": 2, "eval_strategy": "no"})
    config = cpu_copy_of(config_name, tmp_path)
    result = run(cli_train(recipe, "--accelerate-config", str(config), "--num-processes", "2"))
    folder = tmp_path / "out" / "shared"
    assert f"{folder}: ok" in result.stdout and check_adapter(folder, base_model=tiny_qwen3) == []
    assert trainer_record(tmp_path / "out", "shared")["global_step"] == 2
    # DeepSpeed really ran: its checkpoint holds one ZeRO shard of the optimizer state per rank.
    engine_dir = tmp_path / "out" / "_trainer" / "shared" / "checkpoint-2" / "global_step2"
    shards = sorted(p.name for p in engine_dir.glob("*zero_pp_rank_*_optim_states.pt"))
    assert len(shards) == 2 and "rank_1" in shards[1], shards
    # lora_B starts at zero: non-zero saved values mean the trained (under ZeRO-3, gathered) weights were written.
    lora_b = [value for name, value in lora_weights(folder).items() if "lora_B" in name]
    assert lora_b and all(value.abs().sum() > 0 for value in lora_b)


# ---------------------------------------------------------------- two "nodes" on one machine


def node_command(recipe: Path, machine_rank: int, port: int) -> list[str]:
    """One machine of a 2-machine job with one rank on each, through `maps-train train`: the flags a cluster
    scheduler would pass each machine (the same address and port everywhere, its own rank)."""
    return cli_train(recipe, "--role", "shared", "--num-processes", "1", "--num-machines", "2", "--machine-rank",
                     str(machine_rank), "--main-process-ip", "127.0.0.1", "--main-process-port", str(port))


def test_two_node_launch_trains_the_same_adapter_as_one_node(sft_dir, tmp_path):  # noqa: F811
    """Two `maps-train train` processes, machine ranks 0 and 1, meet at 127.0.0.1:P and train one adapter; a
    one-node 2-rank run of the same recipe and seed gives the same LoRA weights. Tolerance 1e-6 (max abs diff): both runs
    see the same global ranks, the same data shards and the same gloo all-reduce of two float32 gradients (a sum of
    two is order-free), so they should agree to the last bit (measured: 0.0); 1e-6 leaves room only for
    kernel-level noise."""
    sft = {"max_steps": 3, "save_steps": 100, "eval_strategy": "no"}
    one_node = write_recipe(tmp_path / "one.yaml", sft_dir, tmp_path / "one", shared_adapter=True, sft=sft)
    two_nodes = write_recipe(tmp_path / "two.yaml", sft_dir, tmp_path / "two", shared_adapter=True, sft=sft)
    run(cli_train(one_node, "--num-processes", "2"))

    port = free_port()
    nodes = [subprocess.Popen(node_command(two_nodes, rank, port), cwd=REPO, env=train_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for rank, (node, output) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {rank} failed:\n{output[-6000:]}"
    assert "--num_machines 2 --machine_rank 1 --main_process_ip 127.0.0.1" in outputs[1]
    assert "machine 1: done; the adapters are written by machine 0" in outputs[1]
    summary = json.loads((tmp_path / "two" / "shared" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and trainer_record(tmp_path / "two", "shared")["global_step"] == 3

    expected, got = lora_weights(tmp_path / "one" / "shared"), lora_weights(tmp_path / "two" / "shared")
    assert sorted(expected) == sorted(got)
    worst = max((expected[name] - got[name]).abs().max().item() for name in expected)
    assert worst < 1e-6, f"two-node LoRA weights differ from one-node ones by {worst}"


def test_resume_skips_a_checkpoint_that_a_kill_cut_short(tmp_path):
    """A kill in the middle of a save leaves a `checkpoint-<N>` holding part of its files (seen: only one rank's
    `rng_state_1.pth`), or one whose `trainer_state.json` rank 0 wrote while rank 1 was still writing its RNG state
    (the Trainer puts no barrier between the two, and fails loading a torn RNG file). transformers'
    `get_last_checkpoint` would resume from either, by its number alone, and fail; the newest whole checkpoint is
    resumed from instead."""
    import torch
    from transformers.trainer_utils import get_last_checkpoint

    from maps_train.train.sft import last_complete_checkpoint

    whole_rng = tmp_path / "rng.pth"
    torch.save({"cpu": torch.get_rng_state()}, whole_rng)
    torn_rng = whole_rng.read_bytes()[: whole_rng.stat().st_size // 2]
    for step, files in ((10, ["adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"]),
                        (20, ["rng_state_1.pth"]),
                        (30, ["adapter_model.safetensors", "rng_state_0.pth", "torn:rng_state_1.pth",
                              "trainer_state.json"])):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        for name in files:
            if name == "trainer_state.json":  # an intact trainer_state.json names its step (a torn one is skipped too)
                (folder / name).write_text(json.dumps({"global_step": step}))
            elif name.startswith("torn:"):
                (folder / name.removeprefix("torn:")).write_bytes(torn_rng)
            elif name.endswith(".pth"):
                (folder / name).write_bytes(whole_rng.read_bytes())
            else:
                (folder / name).write_text("{}")
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-30")  # what resumed before
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert last_complete_checkpoint(tmp_path / "absent") is None


def test_a_resume_restores_to_the_indexed_cpu_device_accelerate_names_a_cpu_rank(tmp_path):
    """accelerate's CPU ranks run on `cpu:0`, the Trainer's map_location for a resumed optimizer state: torch alone
    cannot restore there (what failed a two-rank resume); after `restore_to_indexed_cpu` it can."""
    script = (
        "import torch, sys\n"
        "torch.save({'step': torch.ones(3)}, sys.argv[1])\n"
        "try:\n"
        "    torch.load(sys.argv[1], map_location=torch.device('cpu', 0), weights_only=True)\n"
        "    print('restored before')\n"
        "except RuntimeError:\n"
        "    print('refused before')\n"
        "from maps_train.train.sft import restore_to_indexed_cpu\n"
        "restore_to_indexed_cpu(); restore_to_indexed_cpu()\n"
        "state = torch.load(sys.argv[1], map_location=torch.device('cpu', 0), weights_only=True)\n"
        "print(state['step'].tolist(), state['step'].device)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "optimizer.pt")], cwd=REPO,
                            capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["refused before", "[1.0, 1.0, 1.0] cpu"]
