"""LoRA SFT per role: real TRL + PEFT steps on the tiny Qwen3 under a real 2-rank `accelerate launch` on CPU.

The two slow tests start two launches in all (three per-role adapters in one launch via `--role all`, the shared
adapter through `maps-train train`), then check the adapters the way serving needs them: the vLLM checks pass,
PEFT loads them, and they change the base model's logits.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from toy_sft import write_toy_sft

from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.train.adapter_check import check_adapter, require_valid_adapter

REPO = Path(__file__).resolve().parent.parent
ROLES = ("proposer", "writer", "consolidator")
MAX_STEPS = 6


def write_recipe(path: Path, sft_dir: Path, out_dir: Path, sft: dict | None = None, **train) -> Path:
    raw = {
        "name": "toy-distill",
        "train": {
            "student": "builtin:tiny-qwen3",
            "sft_dir": str(sft_dir),
            "output_dir": str(out_dir),
            "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
            "sft": {
                "learning_rate": 1.0e-2,
                "max_steps": MAX_STEPS,
                "per_device_train_batch_size": 4,
                "logging_steps": 1,
                "max_length": 512,
                **(sft or {}),
            },
            **train,
        },
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def run(command: list[str], cwd: Path = REPO, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sft")
    write_toy_sft(folder)
    return folder


# ---------------------------------------------------------------- data and configs (fast)


def test_sft_rows_drop_metadata_and_shared_concatenates(sft_dir, tmp_path):
    from maps_train.recipe import adapter_names
    from maps_train.train.data import load_adapter_datasets

    recipe = load_recipe(str(write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out")))
    assert adapter_names(recipe) == list(ROLES)
    train, evaluation = load_adapter_datasets(recipe, "writer")
    assert sorted(train.column_names) == ["chat_template_kwargs", "completion", "prompt"]
    assert train[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert train[0]["completion"][0]["role"] == "assistant" and evaluation is not None

    shared = load_recipe(str(tmp_path / "r.yaml"), ["train.shared_adapter=true"])
    assert adapter_names(shared) == ["shared"]
    shared_train, _ = load_adapter_datasets(shared, "shared")
    sizes = [len(load_adapter_datasets(recipe, role)[0]) for role in ROLES]
    assert len(shared_train) == sum(sizes)
    with pytest.raises(MapsTrainError, match=r"--role answer: not an adapter of this recipe"):
        load_adapter_datasets(recipe, "answer")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"bad/train.jsonl:2: invalid JSON"),
        ('{"prompt": [{"role": "user", "content": "q"}]}', r"bad/train.jsonl:2: missing field 'completion'"),
        (
            '{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "user", "content": "a"}]}',
            r"bad/train.jsonl:2: completion\[0\].role must be 'assistant'",
        ),
        ('{"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}', r":2: 'prompt' must be a non-empty"),
    ],
)
def test_bad_sft_rows_name_file_and_line(tmp_path, line, message):
    from maps_train.train.data import read_sft_rows

    good = '{"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}'
    path = tmp_path / "bad" / "train.jsonl"
    path.parent.mkdir()
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(MapsTrainError, match=message):
        read_sft_rows(path, {"enable_thinking": False})


def test_missing_sft_file_is_one_line(tmp_path):
    from maps_train.train.data import load_adapter_datasets

    recipe = load_recipe(str(write_recipe(tmp_path / "r.yaml", tmp_path / "nowhere", tmp_path / "out")))
    with pytest.raises(MapsTrainError, match=r"nowhere/proposer/train.jsonl: no such SFT file"):
        load_adapter_datasets(recipe, "proposer")


def test_sft_and_lora_configs(tmp_path, sft_dir, monkeypatch):
    from maps_train.train import sft

    path = write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out", sft={"bf16": True})
    recipe = load_recipe(str(path), ["wandb.enabled=true", f"wandb.dir={tmp_path / 'wandb'}"])
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    # CPU: float32 weights; bf16 autocast only where the CPU has bf16 instructions, else float32 throughout.
    monkeypatch.setattr(sft, "cpu_multiplies_bf16", lambda: True)
    assert sft.choose_precision(recipe.train.sft.get("bf16"), recipe.train.dtype) == sft.Precision(dtype="float32", bf16=True)
    monkeypatch.setattr(sft, "cpu_multiplies_bf16", lambda: False)
    precision = sft.choose_precision(recipe.train.sft.get("bf16"), recipe.train.dtype)
    assert (precision.dtype, precision.bf16) == ("float32", False)
    args = sft.build_sft_config(recipe, "writer", precision)
    assert args.completion_only_loss is True and args.assistant_only_loss is False
    assert args.use_cpu is True and args.bf16 is False and args.report_to == ["wandb"]
    assert os.environ["WANDB_PROJECT"] == "maps-train" and args.run_name == "toy-distill-writer"
    assert Path(args.output_dir) == tmp_path / "out" / "_trainer" / "writer"
    assert args.learning_rate == 1e-2 and args.lr_scheduler_type == "cosine"  # the recipe's, then our default
    assert args.eval_strategy == "no" and args.per_device_eval_batch_size == 4  # no eval split given
    evaluated = sft.build_sft_config(recipe, "writer", precision, has_eval=True)
    assert evaluated.eval_strategy == "steps" and evaluated.eval_steps == 1  # every logging step unless set
    # Any SFTConfig option goes through as written, with no code for it here.
    noisy = load_recipe(str(path), ["train.sft.neftune_noise_alpha=5", "train.sft.eval_steps=3"])
    noisy_args = sft.build_sft_config(noisy, "writer", precision, has_eval=True)
    assert noisy_args.neftune_noise_alpha == 5.0 and noisy_args.eval_steps == 3
    lora = sft.build_lora_config(recipe.train)
    assert sorted(lora.target_modules) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert lora.modules_to_save is None and (lora.r, lora.lora_alpha, lora.lora_dropout) == (8, 16, 0.0)
    assert sft.build_lora_config(load_recipe(str(path), ["train.lora.r=12"]).train).r == 12  # padded by vLLM
    with pytest.raises(MapsTrainError, match=r"train.lora: vLLM could not serve .*r: 1024 exceeds the largest rank"):
        sft.build_lora_config(load_recipe(str(path), ["train.lora.r=1024"]).train)
    with pytest.raises(MapsTrainError, match=r"train.lora: vLLM could not serve .*r: 0 is not a positive integer rank"):
        sft.build_lora_config(load_recipe(str(path), ["train.lora.r=0"]).train)
    with pytest.raises(MapsTrainError, match=r"train.lora: vLLM could not serve .*target module 'embed_tokens'"):
        sft.build_lora_config(load_recipe(str(path), ["train.lora.target_modules=[q_proj, embed_tokens]"]).train)
    with pytest.raises(MapsTrainError, match=r"train.lora: vLLM could not serve .*use_dora is set"):
        sft.build_lora_config(load_recipe(str(path), ["train.lora.use_dora=true"]).train)


def test_distill_recipes_load_and_fit_vllm():
    from maps_train.train.adapter_check import VLLM_LORA_RANKS

    paths = sorted((REPO / "recipes" / "distill").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"}
    for path in paths:
        recipe = load_recipe(str(path))
        assert recipe.train.student.startswith("Qwen/Qwen3-") and recipe.route("proposer").model == "Qwen/Qwen3-32B"
        rank = recipe.train.lora["r"]
        assert rank in VLLM_LORA_RANKS and recipe.backend.max_lora_rank >= rank
        assert recipe.train.sft["bf16"] and recipe.wandb.enabled and recipe.sft_data.eval_fraction > 0
        assert (REPO / recipe.train.accelerate_config).is_file()
    for name in ("ddp", "zero2", "zero3", "cpu2"):
        assert yaml.safe_load((REPO / "recipes" / "accelerate" / f"{name}.yaml").read_text())["distributed_type"]


def test_launch_command_on_cpu_starts_ranks_with_multi_gpu_flag():
    from maps_train.train.launch import launch_command

    command = launch_command("r.yaml", "writer", ["train.sft.max_steps=3"], num_processes=2, port=29999)
    assert command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert "--multi_gpu" in command and command[command.index("--num_processes") + 1] == "2"
    assert command[command.index("--mixed_precision") + 1] == "no"
    assert command[-7:] == ["-m", "maps_train.train", "--config", "r.yaml", "--role", "writer", "train.sft.max_steps=3"]
    zero2 = str(REPO / "recipes/accelerate/zero2.yaml")
    with_config = launch_command("r.yaml", "writer", accelerate_config=zero2, num_processes=4)
    assert with_config[with_config.index("--config_file") + 1] == zero2 and "--multi_gpu" not in with_config
    assert with_config[with_config.index("--num_processes") + 1] == "4"
    with pytest.raises(MapsTrainError, match=r"nope.yaml: no such accelerate config"):
        launch_command("r.yaml", "writer", accelerate_config="nope.yaml")


def test_several_machines_meet_where_the_options_or_the_config_say(tmp_path, monkeypatch):
    """Two machines through `maps-train train`: the machine rank, the main machine's address and port are passed
    as given (the same port on every machine), accelerate gets the TOTAL rank count (one rank a visible GPU on
    each), and no port is picked here; a config that names them holds, never overridden; a single machine whose
    config sets a port keeps it; several machines without an address are one line."""
    from maps_train.train import launch
    from maps_train.train.launch import Machines, launch_command

    def value(command, name):
        return command[command.index(name) + 1]

    monkeypatch.setattr(launch, "free_port", lambda: pytest.fail("a port was picked for a multi-machine job"))
    node1 = launch_command("r.yaml", "writer", num_processes=1,
                           machines=Machines(2, 1, "10.0.0.1", 29555))
    assert [value(node1, flag) for flag in ("--num_machines", "--machine_rank", "--main_process_ip",
                                            "--main_process_port", "--num_processes")] == ["2", "1", "10.0.0.1",
                                                                                            "29555", "2"]
    assert node1.count("--main_process_port") == 1 and "--multi_gpu" in node1

    monkeypatch.setattr(launch, "visible_gpu_count", lambda: 8)
    ddp = yaml.safe_load((REPO / "recipes/accelerate/ddp.yaml").read_text())
    cluster = tmp_path / "two-nodes.yaml"
    cluster.write_text(yaml.safe_dump({**ddp, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1",
                                       "main_process_port": 29600}))
    from_config = launch_command("r.yaml", "writer", accelerate_config=str(cluster))
    assert value(from_config, "--num_processes") == "16"  # 8 visible GPUs on each of the config's 2 machines
    assert not {"--main_process_port", "--main_process_ip", "--machine_rank", "--num_machines"} & set(from_config)
    ranked = launch_command("r.yaml", "writer", accelerate_config=str(cluster), machines=Machines(machine_rank=0))
    assert value(ranked, "--machine_rank") == "0" and "--main_process_port" not in ranked

    one = tmp_path / "one-node-port.yaml"
    one.write_text(yaml.safe_dump({**ddp, "main_process_port": 29700}))
    assert "--main_process_port" not in launch_command("r.yaml", "writer", accelerate_config=str(one))

    with pytest.raises(MapsTrainError, match="2 machines need the main machine's address and port") as err:
        launch_command("r.yaml", "writer", machines=Machines(num_machines=2, machine_rank=0))
    assert "\n" not in str(err.value)
    with pytest.raises(MapsTrainError, match="machine rank 2 is outside 0..1"):
        launch_command("r.yaml", "writer", machines=Machines(2, 2, "10.0.0.1", 29555))


def test_the_plan_of_several_machines_is_per_machine(tmp_path, monkeypatch):
    """An accelerate config for 2 machines of 8 GPUs says num_processes: 16 (accelerate counts every machine's
    ranks): each machine starts 8, so an 8-GPU machine fits (it was refused as '16 ranks, the hardware has 8'); a
    count over the machine's GPUs is still refused."""
    from maps_train.plan.stages import make_plan

    monkeypatch.chdir(REPO)
    ddp = yaml.safe_load((REPO / "recipes/accelerate/ddp.yaml").read_text())
    cluster = tmp_path / "two-nodes.yaml"
    cluster.write_text(yaml.safe_dump({**ddp, "num_processes": 16, "num_machines": 2,
                                       "main_process_ip": "10.0.0.1", "main_process_port": 29600}))
    plan = make_plan("recipes/distill/qwen3-4b.yaml", [f"train.accelerate_config={cluster}"])
    (train,) = [row for row in plan.rows if row.stage.startswith("train")]
    assert train.process.startswith("8 x rank Qwen/Qwen3-4B") and train.process.endswith("each of 2 machines")
    assert not [p for p in plan.problems if p.startswith("train")]
    crowded = make_plan("recipes/distill/qwen3-4b.yaml", [f"train.accelerate_config={cluster}"], gpus=4)
    assert [p for p in crowded.problems if "starts 8 ranks" in p and "set num_processes: 8" in p]


@pytest.mark.parametrize("one_launch", [False, True])
def test_train_all_launches_per_adapter_or_once_and_skips_finished_ones(sft_dir, tmp_path, monkeypatch, one_launch):
    """What `maps-train train --role all` hands to the launcher: one launch per unfinished adapter, or (with
    train.one_launch) one `--role all` launch for all of them; finished adapters are never relaunched. The launcher
    is a recording double here; the real one-launch `--role all` training is `per_role_adapters` below."""
    from maps_train.train import launch
    from maps_train.train.sft import SUMMARY_FILE

    recipe = write_recipe(tmp_path / "recipe.yaml", sft_dir, tmp_path / "adapters", one_launch=one_launch)
    (tmp_path / "adapters" / "proposer").mkdir(parents=True)
    (tmp_path / "adapters" / "proposer" / SUMMARY_FILE).write_text("{}")  # already trained
    commands = []

    def recording_launcher(command):
        commands.append(command)
        role = command[command.index("--role") + 1]
        for adapter in (["writer", "consolidator"] if role == "all" else [role]):
            (tmp_path / "adapters" / adapter).mkdir(parents=True, exist_ok=True)
            (tmp_path / "adapters" / adapter / SUMMARY_FILE).write_text("{}")
        return 0

    monkeypatch.setattr(launch.subprocess, "call", recording_launcher)
    folders = launch.train_all(str(recipe), echo=lambda line: None)
    assert [f.name for f in folders] == ["proposer", "writer", "consolidator"]
    roles = [command[command.index("--role") + 1] for command in commands]
    assert roles == (["all"] if one_launch else ["writer", "consolidator"])
    commands.clear()
    launch.train_all(str(recipe), echo=lambda line: None)
    assert commands == []  # everything finished: nothing launched


# ---------------------------------------------------------------- adapter checks on constructed adapters


def _peft_adapter(base: str, folder: Path, **lora) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(task_type="CAUSAL_LM", **{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **lora})
    get_peft_model(model, config).save_pretrained(str(folder))
    return folder


def test_adapter_check_catches_what_vllm_refuses(tiny_qwen3, tmp_path):
    good = _peft_adapter(tiny_qwen3, tmp_path / "good")
    assert check_adapter(good, base_model=tiny_qwen3) == []

    odd_rank = _peft_adapter(tiny_qwen3, tmp_path / "rank", r=4)  # not a --max-lora-rank choice, still served
    assert check_adapter(odd_rank) == []
    config_path = odd_rank / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "r": 1024}))
    bad_rank = odd_rank
    assert any("r: 1024 exceeds the largest rank vLLM serves" in p for p in check_adapter(bad_rank))

    saved_head = _peft_adapter(tiny_qwen3, tmp_path / "head", modules_to_save=["lm_head"])
    problems = check_adapter(saved_head)
    assert any("modules_to_save" in p for p in problems)
    assert any("embed_tokens/lm_head" in p for p in problems)

    embeddings = _peft_adapter(tiny_qwen3, tmp_path / "embed", target_modules=["q_proj", "embed_tokens"])
    assert any("embed_tokens" in p for p in check_adapter(embeddings))

    (good / "tokenizer.json").write_text("{}")
    assert any("tokenizer files" in p for p in check_adapter(good))
    (good / "tokenizer.json").unlink()

    # A base with other layer sizes: the adapter's input sizes no longer fit.
    other_base = tmp_path / "other-base"
    other_base.mkdir()
    config = json.loads((Path(tiny_qwen3) / "config.json").read_text())
    (other_base / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    assert any("does not match" in p for p in check_adapter(good, base_model=str(other_base)))

    with pytest.raises(MapsTrainError, match=r"adapter vLLM would not serve: r: 1024 exceeds"):
        require_valid_adapter(bad_rank)
    with pytest.raises(MapsTrainError, match=r"not an adapter folder"):
        check_adapter(tmp_path)

    from typer.testing import CliRunner

    from maps_train.cli import app

    result = CliRunner().invoke(app, ["adapters", "check", str(good), str(bad_rank)])
    assert result.exit_code == 1 and f"{good}: ok" in result.output and "r: 1024" in result.output


# ---------------------------------------------------------------- one process, two steps: the eval loss is logged


def trainer_record(adapters: Path, adapter: str, name: str = "trainer_state.json") -> dict:
    """One of the Trainer's own files for `adapter` (trainer_state.json, train_results.json, eval_results.json),
    saved in its output folder `<train.output_dir>/_trainer/<adapter>/`."""
    return json.loads((adapters / "_trainer" / adapter / name).read_text())


def logged(trainer_state: dict, key: str) -> list[tuple[int, float]]:
    """(step, value) of every entry of the Trainer's log history holding `key`."""
    return [(entry["step"], entry[key]) for entry in trainer_state["log_history"] if key in entry]


def test_eval_loss_is_in_the_trainers_records(sft_dir, tmp_path, monkeypatch):
    """With an eval split, TRL evaluates every eval_steps (here every logging step): the eval losses land in the
    trainer's log history (and so in W&B through the transformers integration), saved by the Trainer itself in
    trainer_state.json and eval_results.json; train_summary.json keeps only the project's own fields."""
    from maps_train.train.__main__ import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out", sft={"max_steps": 2, "save_steps": 100})
    assert main(["--config", str(path), "--role", "writer"]) == 0
    summary = json.loads((tmp_path / "out" / "writer" / "train_summary.json").read_text())
    state = trainer_record(tmp_path / "out", "writer")
    assert summary["eval_rows"] > 0 and state["global_step"] == 2
    eval_losses = logged(state, "eval_loss")
    assert [step for step, _ in eval_losses] == [1, 2] and all(math.isfinite(loss) for _, loss in eval_losses)
    final_eval = trainer_record(tmp_path / "out", "writer", "eval_results.json")["eval_loss"]
    assert final_eval == eval_losses[-1][1] and len(logged(state, "loss")) == 2
    assert math.isfinite(trainer_record(tmp_path / "out", "writer", "train_results.json")["train_loss"])
    assert not {"global_step", "losses", "eval_losses", "eval_loss", "train_loss", "train_runtime"} & set(summary)


def test_bf16_on_the_cpu_trains_under_autocast_where_the_cpu_multiplies_bf16(sft_dir, tmp_path, monkeypatch):
    """`train.sft.bf16` on a CPU: what the trainer's loss actually ran under is bf16 autocast where the CPU has bf16
    instructions, and plain float32 elsewhere; the summary says which."""
    import torch
    from trl import SFTTrainer

    from maps_train.train import sft
    from maps_train.train.__main__ import main

    seen = []  # (autocast on, output dtype) of one projection inside the trained model, at every forward
    compute_loss = SFTTrainer.compute_loss

    def recording(self, model, *args, **kwargs):
        if not seen:
            linear = next(m for name, m in model.named_modules() if name.endswith("q_proj.base_layer"))
            linear.register_forward_hook(lambda m, i, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
        return compute_loss(self, model, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "compute_loss", recording)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = write_recipe(tmp_path / "r.yaml", sft_dir, tmp_path / "out",
                        sft={"max_steps": 1, "save_steps": 100, "bf16": True, "eval_strategy": "no"})
    assert main(["--config", str(path), "--role", "writer"]) == 0
    summary = json.loads((tmp_path / "out" / "writer" / "train_summary.json").read_text())
    train_loss = trainer_record(tmp_path / "out", "writer", "train_results.json")["train_loss"]
    native = sft.cpu_multiplies_bf16()
    assert summary["bf16"] is native and summary["dtype"] == "float32" and math.isfinite(train_loss)
    assert seen == [(native, torch.bfloat16 if native else torch.float32)] * len(seen)


# ---------------------------------------------------------------- real training under accelerate launch


@pytest.fixture(scope="module")
def per_role_adapters(sft_dir, tmp_path_factory) -> Path:
    """Three adapters trained in one 2-rank CPU launch (`--role all`, in sequence in the same ranks)."""
    from maps_train.platform import free_port

    root = tmp_path_factory.mktemp("per-role")
    recipe = write_recipe(root / "recipe.yaml", sft_dir, root / "adapters")
    run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/cpu2.yaml",
         "--main_process_port", str(free_port()), "-m", "maps_train.train", "--config", str(recipe), "--role", "all"]
    )
    return root / "adapters"


def _logits(model, tokenizer):
    import torch

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Question: who directed Cast Away?"}],
        tokenize=False, add_generation_prompt=True, enable_thinking=False,
    )
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits[0, -1].clone()


@pytest.mark.slow
def test_per_role_adapters_train_on_two_ranks_and_change_the_model(per_role_adapters, tiny_qwen3, sft_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for role in ROLES:
        folder = per_role_adapters / role
        summary = json.loads((folder / "train_summary.json").read_text())
        state = trainer_record(per_role_adapters, role)
        assert summary["world_size"] == 2 and state["global_step"] == MAX_STEPS
        losses = [loss for _, loss in logged(state, "loss")]
        assert len(losses) == MAX_STEPS and all(math.isfinite(loss) for loss in losses)
        assert min(losses[2:]) < losses[0], f"{role}: loss did not go down: {losses}"
        assert summary["train_tokens_per_second"] > 0 and summary["trace_roles"]
        assert check_adapter(folder, base_model=tiny_qwen3) == []
        assert not (folder / "tokenizer.json").exists() and not (folder / "training_args.bin").exists()
    consolidator = json.loads((per_role_adapters / "consolidator" / "train_summary.json").read_text())
    assert consolidator["trace_roles"] == ["answer", "consolidator"]
    # What the adapter learned, per role (the distilled routes send a role with 0 rows to the base model).
    rows = [json.loads(line)["role"] for line in (sft_dir / "consolidator" / "train.jsonl").read_text().splitlines()]
    assert consolidator["rows_per_role"] == {"answer": rows.count("answer"), "consolidator": rows.count("consolidator")}
    assert consolidator["train_rows"] == len(rows) and rows.count("answer") > 0

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    base_logits = _logits(base, tokenizer)
    model = PeftModel.from_pretrained(base, str(per_role_adapters / "proposer"), adapter_name="proposer")
    for role in ("writer", "consolidator"):
        model.load_adapter(str(per_role_adapters / role), adapter_name=role)
    per_adapter = {}
    for role in ROLES:
        model.set_adapter(role)
        per_adapter[role] = _logits(model.eval(), tokenizer)
        assert not torch.allclose(per_adapter[role], base_logits, atol=1e-5), f"{role} adapter changed nothing"
    assert not torch.allclose(per_adapter["proposer"], per_adapter["writer"], atol=1e-5)
    with model.disable_adapter():
        assert torch.allclose(_logits(model, tokenizer), base_logits, atol=1e-6)


def test_a_saved_adapter_is_the_trained_one_alone_naming_the_recorded_base(tiny_qwen3, tmp_path):
    """`save_adapter`, as SFT and RL call it: the config names the base as recorded (a hub id here, not the local
    folder the model was loaded from) in inference mode; no tokenizer files, no trainer args, no second adapter
    (GRPO's frozen "ref" copy, which PEFT saves in a subfolder); and the folder passes vLLM's checks."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from maps_train.train.sft import save_adapter

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3), lora)
    model.add_adapter("ref", lora)
    assert model.peft_config["default"].base_model_name_or_path != "Qwen/Qwen3-0.6B"
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path / "trainer"), use_cpu=True, report_to=[]),
                      processing_class=AutoTokenizer.from_pretrained(tiny_qwen3))
    folder = tmp_path / "adapter"
    save_adapter(trainer, folder, "Qwen/Qwen3-0.6B")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "Qwen/Qwen3-0.6B" and config["inference_mode"] is True
    saved = {path.name for path in folder.iterdir()} - {"README.md"}  # PEFT's model card stays
    assert saved == {"adapter_config.json", "adapter_model.safetensors"}
    assert check_adapter(folder) == []


@pytest.mark.slow
def test_vllm_accepts_the_adapter_config(per_role_adapters):
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_local_dir(str(per_role_adapters / "writer"), max_position_embeddings=4096)
    helper.validate_legal(LoRAConfig(max_lora_rank=8))
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        helper.validate_legal(LoRAConfig(max_lora_rank=1))


@pytest.mark.slow
def test_shared_adapter_through_the_cli_with_wandb_offline(sft_dir, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", sft_dir, tmp_path / "adapters", shared_adapter=True)
    overrides = ["wandb.enabled=true", f"wandb.dir={tmp_path / 'wandb'}", "wandb.mode=offline"]
    command = [sys.executable, "-m", "maps_train.cli", "train", str(recipe), *overrides, "--num-processes", "2"]
    result = run(command)
    folder = tmp_path / "adapters" / "shared"
    assert f"{folder}: ok" in result.stdout
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["_trainer", "adapters.json", "shared"]
    summary = json.loads((folder / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["sft_sources"] == list(ROLES)
    assert summary["trace_roles"] == ["answer", "consolidator", "proposer", "writer"]
    assert summary["train_rows"] == sum(
        sum(1 for _ in (sft_dir / role / "train.jsonl").open()) for role in ROLES
    )
    assert check_adapter(folder) == []
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run was written"

    again = run(command)  # finished adapters are skipped, not retrained
    assert "already trained" in again.stdout and "accelerate.commands.launch" not in again.stdout
