"""`maps-train rl` end to end on real components: TRL's GRPOTrainer on the tiny Qwen3 with a distilled (random)
consolidator adapter, the environment the same model through the project's hf backend, BM25 over the demo corpus.

The tiny model's outputs are random tokens (seeded), so no answer is ever right by knowledge. The questions' golds
are every whole word of the tiny model's vocabulary and correctness is F1: an answer scores 2 / (words + 1) when one
of its words is a vocabulary word (the best alias), else 0, so G = 4 branches of different lengths and words score
differently, groups differ and GRPO has an advantage to follow (unscaled: `scale_rewards: none`). A run is SIGKILLed after its first checkpoint and rerun: it resumes from that checkpoint and ends at
max_steps with an adapter that differs from the distilled one and that vLLM could serve."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_train_scale import wait_for

from maps_train.adapters import rl_source_set
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.rl.checks import check_rl_config
from maps_train.rl.environment import environment_recipe
from maps_train.rl.layout import RoleRun, claim_folder
from maps_train.train.adapter_check import check_adapter

REPO = Path(__file__).resolve().parent.parent
MAX_STEPS = 2
WEIGHTS = "adapter_model.safetensors"


def vocabulary_words() -> list[str]:
    """Every whole word (letters only, after the byte-level space marker) of the tiny Qwen3's vocabulary."""
    from transformers import AutoTokenizer

    from maps_train.models import resolve_model

    vocab = AutoTokenizer.from_pretrained(resolve_model("builtin:tiny-qwen3")).get_vocab()
    return sorted({token.lstrip("\u0120").lower() for token in vocab if token.lstrip("\u0120").isalpha()})


def write_world(tmp_path: Path, adapters_dir: Path, question_count: int = 2) -> Path:
    demo = [json.loads(line) for line in (REPO / "data/demo/train.jsonl").read_text().splitlines()[:question_count]]
    questions = tmp_path / "questions.jsonl"
    golds = vocabulary_words()
    questions.write_text("".join(json.dumps({**row, "golden_answers": golds}) + "\n" for row in demo))
    recipe = {
        "name": "rl-test",
        "retrieval": {"kind": "bm25", "corpus": str(REPO / "data/demo/corpus.jsonl"),
                      "index_dir": str(tmp_path / "index")},
        "backend": {"max_model_len": 2048},
        "roles": {"default": {"backend": "hf", "model": "builtin:tiny-qwen3", "max_tokens": 8}},
        "agent": {"max_rounds": 1, "num_directions": 1, "top_k": 2},
        "train": {"student": "builtin:tiny-qwen3"},
        "rl": {"roles": ["consolidator"], "adapters_dir": str(adapters_dir), "questions": [str(questions)],
               "environment": "recipe",
               "output_dir": str(tmp_path / "rl"), "num_generations": 4, "max_completion_tokens": 4, "seed": 0,
               "reward": {"correctness": "f1"},
               "role_reward": {"consolidator": {"cost_weight": 0.3, "charge_cost": "all"}},
               # The random model never writes its end-of-turn token in 4: every completion is cut, and the default
               # mask_truncated_completions would leave nothing to train on.
               "grpo": {"per_device_train_batch_size": 4, "max_steps": MAX_STEPS, "save_steps": 1,
                        "mask_truncated_completions": False,
                        "learning_rate": 1e-3, "logging_steps": 1}},
        "wandb": {"enabled": False},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def lora_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / WEIGHTS))


def test_grpo_changes_the_adapter_and_resumes_after_a_kill(tmp_path, tiny_qwen3, make_lora_adapters):
    distilled = Path(make_lora_adapters(tiny_qwen3, ["consolidator"])["consolidator"])
    # 3 questions, one a step: MAX_STEPS ends inside the first epoch, where a Trainer resumed at its last step
    # would go on for one more (at an epoch's end it would stop).
    recipe = write_world(tmp_path, distilled.parent, question_count=3)
    command = [sys.executable, "-m", "maps_train.cli", "rl", str(recipe)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    # trainer_state.json is among the last files a checkpoint writes: its presence means the checkpoint is usable.
    first_state = tmp_path / "rl" / "_trainer" / "consolidator" / "checkpoint-1" / "trainer_state.json"
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(first_state.is_file, process)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "rl" / "adapters" / "consolidator" / "rl_summary.json").exists()

    rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = re.search(r"resuming from \S+checkpoint-(\d+)", rerun.stderr + rerun.stdout)
    assert resumed and 1 <= int(resumed.group(1)) < MAX_STEPS  # from the checkpoint the kill left, not afresh

    out = tmp_path / "rl" / "adapters" / "consolidator"
    summary = json.loads((out / "rl_summary.json").read_text())
    assert summary["global_step"] == MAX_STEPS
    assert summary["source_adapter"] == str(distilled) and summary["rl_adapter"] == str(out)
    assert summary["trained_roles"] == ["answer", "consolidator"]
    # The role's own reward (rl.role_reward over rl.reward) reached TRL's GRPOConfig and was recorded.
    reward = summary["reward_settings"]["reward"]
    assert (reward["correctness"], reward["cost_weight"], reward["charge_cost"]) == ("f1", 0.3, "all")
    args = torch.load(tmp_path / "rl" / "_trainer" / "consolidator" / "checkpoint-1" / "training_args.bin",
                      weights_only=False)
    assert list(args.reward_weights) == [1.0, 0.1, 0.3, 0.0, 0.5]  # correctness, format, cost, evidence, process
    state = json.loads((tmp_path / "rl" / "_trainer" / "consolidator" / "trainer_state.json").read_text())
    steps = [entry["step"] for entry in state["log_history"] if "reward" in entry]
    assert steps == list(range(1, MAX_STEPS + 1))  # each step once: the resumed run continued, did not restart
    logged = state["log_history"][-2]
    assert {"rewards/correctness/mean", "rewards/format/mean", "rewards/cost/mean", "rewards/evidence/mean",
            "rewards/process/mean", "kl",
            "episode/cover_em", "episode/tokens"} <= set(logged)
    # Step 1 samples the distilled adapter with fixed seeds: its branches differ, so its update moves the policy.
    # (Later steps sample the moved policy, whose groups may all agree: their spread is not this test's business.)
    assert state["log_history"][0]["step"] == 1 and state["log_history"][0]["reward_std"] > 0
    # The resumed step started from the checkpoint's policy, which step 1 had moved off the distilled (ref) one.
    assert state["log_history"][1]["kl"] > 0

    before, after = lora_weights(distilled), lora_weights(out)
    assert sorted(before) == sorted(after)  # the same adapter (only "default": TRL's frozen "ref" copy not saved)
    assert any(not (before[key] == after[key]).all() for key in before)
    assert not (out / "ref").exists() and check_adapter(out) == []
    overall = json.loads((tmp_path / "rl" / "rl_summary.json").read_text())
    assert overall["lineage"] == [{"source_adapter": str(distilled), "rl_adapter": str(out),
                                   "source_sha256": hashlib.sha256((distilled / WEIGHTS).read_bytes()).hexdigest(),
                                   "rl_sha256": hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()}]
    # The adapter set RL leaves (adapters.json): its RL adapter for the roles it trained, the rest as it started.
    from maps_train.adapters import AdapterSet

    left = AdapterSet.load(tmp_path / "rl" / "adapters", {})
    assert left.from_manifest and left.folder_of("consolidator") == left.folder_of("answer") == out
    assert left.adapter_of("consolidator").parent == str(distilled) and left.adapter_of("consolidator").stage == "rl"
    assert left.adapter_of("consolidator").sha256 == overall["lineage"][0]["rl_sha256"]
    assert left.folder_of("writer") == distilled.parent / "writer"

    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already trained" in again.stdout  # a finished role is not retrained

    # A kill after the last checkpoint, before the summary: the rerun saves that checkpoint's policy and trains no
    # step more (the Trainer alone, resumed at max_steps, would train step MAX_STEPS + 1).
    final = lora_weights(out)
    (out / "rl_summary.json").unlink()
    last = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr[-3000:]
    assert f"checkpoint-{MAX_STEPS} holds the last step ({MAX_STEPS}): saving it, no step more" in last.stdout
    assert json.loads((out / "rl_summary.json").read_text())["global_step"] == MAX_STEPS
    state = json.loads((tmp_path / "rl" / "_trainer" / "consolidator" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "reward" in entry] == list(range(1, MAX_STEPS + 1))
    assert all(torch.equal(final[key], weights) for key, weights in lora_weights(out).items())


@pytest.mark.parametrize("override, message", [
    ("rl.num_generations=3", "must be a multiple of rl.num_generations (3)"),
    ("rl.roles=[critic]", "rl.roles: 'critic' is no role"),
    ("rl.roles=[consolidator,consolidator]", "train one adapter twice"),
    ("rl.temperature=0", "rl.temperature: must be a finite number > 0"),
])
def test_a_recipe_rl_cannot_run_is_refused_in_one_line_before_anything_loads(override, message):
    with pytest.raises(MapsTrainError) as err:
        check_rl_config(load_recipe(None, [override]))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ConfigError) or "critic" in override


def test_rl_never_writes_into_a_folder_it_did_not_make(tmp_path):
    foreign = tmp_path / "someone-elses"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(MapsTrainError, match="has no .written-by-maps-train"):
        claim_folder(foreign, "consolidator")
    assert (foreign / "notes.txt").read_text() == "keep me"
    claim_folder(tmp_path / "fresh", "consolidator")
    claim_folder(tmp_path / "fresh", "consolidator")  # ours: written into again (a resume)
    assert (tmp_path / "fresh" / ".written-by-maps-train").is_file()


def test_the_environment_is_the_distilled_student_unless_the_recipe_says_otherwise(tmp_path):
    overrides = ["train.student=builtin:tiny-qwen3", f"rl.adapters_dir={tmp_path / 'sft'}",
                 f"rl.output_dir={tmp_path / 'rl'}", "roles.default.model=teacher-32b"]
    engine = environment_recipe(load_recipe(None, overrides))
    assert {(r.backend, r.model, r.adapter) for r in engine.roles.values()} >= {
        ("vllm", "builtin:tiny-qwen3", str(tmp_path / "sft" / name)) for name in ("proposer", "writer")}
    assert engine.route("answer").adapter == str(tmp_path / "sft" / "consolidator")  # the adapter of its role
    served = environment_recipe(load_recipe(None, [*overrides, "rl.environment=server"]))
    assert (served.route("writer").backend, served.route("writer").adapter) == ("openai", "writer")
    as_written = environment_recipe(load_recipe(None, [*overrides, "rl.environment=recipe"]))
    assert as_written.route("writer").model == "teacher-32b"  # the recipe's own (here: its teacher's) routes
    # Once RL'd, an adapter's roles run with the new adapter in the next role's environment.
    recipe = load_recipe(None, overrides)
    after = environment_recipe(recipe, RoleRun.of(recipe, "consolidator").with_rl_adapter(
        rl_source_set(recipe), ["consolidator", "answer"]))
    assert {after.route(r).adapter for r in ("consolidator", "answer")} == {str(tmp_path / "rl/adapters/consolidator")}
    assert after.route("writer").adapter == str(tmp_path / "sft" / "writer")


def test_a_second_rl_run_into_the_same_folder_is_refused_while_the_first_holds_it(tmp_path):
    from maps_train.rl.trainer import rl_stage
    from maps_train.runlock import sole_writer

    folder = tmp_path / "rl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from maps_train.runlock import sole_writer\n"
         f"with sole_writer(Path({str(folder)!r}), 'maps-train rl'):\n print('held', flush=True); sys.stdin.readline()"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # the first run holds the folder
        with pytest.raises(MapsTrainError) as err:
            rl_stage(load_recipe(None, [f"rl.output_dir={folder}"]))  # refused before any question or model loads
        assert f"already writing here (pid {holder.pid})" in str(err.value) and "\n" not in str(err.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    with sole_writer(folder, "maps-train rl"):  # released when its holder ended
        assert (folder / ".lock").read_text().splitlines()[0] == f"pid {os.getpid()}"
