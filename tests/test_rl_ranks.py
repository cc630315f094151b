"""`maps-train rl` as the multi-GPU recipe runs it, on two CPU ranks: `accelerate launch --num_processes 2
-m maps_train.rl` over the world of test_rl_train (tiny Qwen3, a random distilled consolidator adapter, BM25 over the
demo corpus, the environment through the hf backend), with 4 questions, G=4 and 2 questions per step (one per rank).

On a machine without CUDA it is `--multi_gpu` that starts two ranks (they join a gloo group because the trainer asks
accelerate for the CPU); `--cpu --num_processes 2` quietly starts ONE process (accelerate's MULTI_CPU path expects
mpirun), which would check nothing here (see recipes/accelerate/cpu2.yaml).

What must hold with two ranks: each rank rolls out its own questions (TRL's sampler splits each step's groups over
the ranks: seen in the rollout log line each rank writes per step); the ranks train ONE adapter (DDP) that rank 0
saves, checks and records once; a rerun skips it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_rl_train import MAX_STEPS, REPO, WEIGHTS, lora_weights, vocabulary_words, write_world

from maps_train.errors import ConfigError
from maps_train.platform import free_port
from maps_train.recipe import load_recipe
from maps_train.rl.checks import check_rl_config
from maps_train.train.adapter_check import check_adapter

RANKS = 2
QUESTIONS = 4  # 2 steps x 2 ranks x 1 group of G=4 per rank (per_device_train_batch_size 4): each question once
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(RANKS),
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
# What MapsRollouts logs on each rank before it plays a step's groups (maps_train.rl.trainer).
ROLLOUT_LINE = re.compile(r"rl rollout: rank (\d+)/(\d+) step (\d+): questions (\S+)")


def write_ranks_world(tmp_path: Path, adapters_dir: Path) -> tuple[Path, list[str]]:
    """test_rl_train's recipe with QUESTIONS training questions (the vocabulary's words as golds, as there)."""
    recipe_path = write_world(tmp_path, adapters_dir)
    rows = [json.loads(line) for line in (REPO / "data/demo/train.jsonl").read_text().splitlines()[:QUESTIONS]]
    questions = tmp_path / "questions-4.jsonl"
    golds = vocabulary_words()
    questions.write_text("".join(json.dumps({**row, "golden_answers": golds}) + "\n" for row in rows))
    recipe = yaml.safe_load(recipe_path.read_text())
    recipe["rl"]["questions"] = [str(questions)]
    recipe_path.write_text(yaml.safe_dump(recipe))
    return recipe_path, [row["id"] for row in rows]


def launch_rl(recipe: Path) -> subprocess.CompletedProcess:
    command = [*LAUNCH, "--main_process_port", str(free_port()), "-m", "maps_train.rl", "--config", str(recipe)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def questions_by_step_and_rank(log: str) -> dict[int, dict[int, list[str]]]:
    """{global step: {rank: the question ids that rank rolled out}} from the ranks' rollout log lines."""
    seen: dict[int, dict[int, list[str]]] = {}
    for rank, world, step, ids in ROLLOUT_LINE.findall(log):
        assert int(world) == RANKS, f"a rank saw a world of {world} processes, not {RANKS}"
        by_rank = seen.setdefault(int(step), {})
        assert int(rank) not in by_rank, f"rank {rank} rolled out step {step} twice"
        by_rank[int(rank)] = ids.split(",")
    return seen


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_two_ranks_split_the_questions_and_train_one_adapter_written_once(tmp_path, tiny_qwen3, make_lora_adapters):
    distilled = Path(make_lora_adapters(tiny_qwen3, ["consolidator"])["consolidator"])
    recipe, question_ids = write_ranks_world(tmp_path, distilled.parent)

    result = launch_rl(recipe)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]

    # Each step, each rank rolled out a group of its own: together every question once, no rank a question twice.
    seen = questions_by_step_and_rank(log)
    assert sorted(seen) == list(range(MAX_STEPS)), log[-3000:]  # rollouts happen at global steps 0 and 1
    for step, by_rank in seen.items():
        assert sorted(by_rank) == list(range(RANKS)), f"step {step}: rollouts from ranks {sorted(by_rank)}"
        assert all(len(ids) == 1 for ids in by_rank.values()), by_rank  # 4 rollouts per rank = one group of G=4
        assert by_rank[0] != by_rank[1], f"step {step}: both ranks rolled out {by_rank[0]}"
    rolled_out = [qid for by_rank in seen.values() for ids in by_rank.values() for qid in ids]
    assert sorted(rolled_out) == sorted(question_ids)

    # One adapter, trained (not the distilled one), complete as vLLM loads it.
    out = tmp_path / "rl" / "adapters" / "consolidator"
    before, after = lora_weights(distilled), lora_weights(out)
    assert sorted(before) == sorted(after)
    assert any(not (before[key] == after[key]).all() for key in before)
    assert not (out / "ref").exists() and check_adapter(out) == []

    # The Trainer's records: each step once (two ranks are one DDP run, not two runs logging into one file).
    state = json.loads((tmp_path / "rl" / "_trainer" / "consolidator" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "reward" in entry] == list(range(1, MAX_STEPS + 1))
    assert state["global_step"] == MAX_STEPS

    # rl_summary.json: whole, the right lineage, written by rank 0 alone (one "wrote" line, no temporary left).
    overall_path = tmp_path / "rl" / "rl_summary.json"
    overall = json.loads(overall_path.read_text())
    assert overall["lineage"] == [{"source_adapter": str(distilled), "rl_adapter": str(out),
                                   "source_sha256": sha256(distilled / WEIGHTS), "rl_sha256": sha256(out / WEIGHTS)}]
    assert overall["roles"]["consolidator"]["global_step"] == MAX_STEPS
    assert log.count(f"rl: wrote {overall_path}") == 1, "rl_summary.json written by more than one rank"
    # Hidden files: the run lock alone (it stays, as flock lock files do), no temporary of a summary write.
    assert sorted(p.name for p in overall_path.parent.iterdir() if p.name.startswith(".")) == [".lock"]
    assert (tmp_path / "rl" / "curves-consolidator.png").is_file()

    again = launch_rl(recipe)
    assert again.returncode == 0 and "already trained" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert sha256(out / WEIGHTS) == overall["lineage"][0]["rl_sha256"]  # the finished adapter was left alone


@pytest.mark.parametrize("overrides, message", [
    ([], "rl.environment: 'distilled' starts an in-process vLLM engine on each of the 2 ranks, all on GPU 0; "
         "with several ranks use rl.environment: server"),
    (["rl.environment=recipe", "roles.default.backend=vllm"], "roles: proposer, writer route to an in-process vLLM "
                                                               "engine, which each of the 2 ranks would start"),
])
def test_an_environment_engine_per_rank_is_refused_before_anything_loads(tmp_path, monkeypatch, overrides, message):
    """Every rank builds its own environment, and an in-process vLLM engine takes GPU 0: with several ranks (WORLD_SIZE,
    set by the launcher) such an environment is refused in one line; one rank, or served adapters, are fine."""
    base = ["train.student=builtin:tiny-qwen3", f"rl.adapters_dir={tmp_path / 'sft'}", f"rl.output_dir={tmp_path / 'rl'}"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as err:
        check_rl_config(load_recipe(None, [*base, *overrides]))
    assert message in str(err.value) and "\n" not in str(err.value)
    check_rl_config(load_recipe(None, [*base, *overrides, "rl.environment=server"]))
    check_rl_config(load_recipe(None, [*base, "rl.environment=recipe", "roles.default.backend=hf"]))
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_rl_config(load_recipe(None, [*base, *overrides]))
