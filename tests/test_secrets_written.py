"""No secret reaches a file, stdout or W&B: each test passes a distinctive fake key the ways a user would (a dotted
override, a vLLM flag in `serve.extra_args`, a URL's user:password, the command line) and then reads back what was
actually written or printed, byte for byte.

`FixedAnswerRunner` (from test_eval_suite) stands in for the agent in the suite run: the secrets travel in the
suite and its recipes, not in model calls, and a real model adds nothing there but minutes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_eval_suite import FixedAnswerRunner, write_jsonl
from typer.testing import CliRunner

from maps_train.config.redaction import redact_secrets

KEY = "sk-test-LEAKCHECK-123"
MARKER = b"LEAKCHECK"  # the key's distinctive part: found even if something re-quotes or cuts the key
URL = f"http://maps-user:{KEY}@127.0.0.1:8000/v1"
SHOWN_URL = "http://***@127.0.0.1:8000/v1"
# The command line of a stage run with the key as an override, as W&B would otherwise record it.
ARGV = ["maps-train", "eval", "suite.yaml", f"backend.api_key={KEY}"]


def files_holding_the_key(root: Path) -> list[Path]:
    """Every file under `root` (links followed: wandb links its core log into the run) whose bytes hold the key."""
    return [path for path in sorted(root.rglob("*")) if path.is_file() and MARKER in path.read_bytes()]


def run_files(root: Path) -> list[Path]:
    """The `.wandb` protobuf logs of the offline runs under `root`: config, metadata and history all land there."""
    return sorted(root.rglob("offline-run-*/run-*.wandb"))


@pytest.fixture()
def fresh_wandb():
    """W&B as a new process finds it: offline, no other variable of wandb's in the environment (a training test
    before this one leaves its own), and no setup made from an earlier environment (wandb reads it once a process,
    in `wandb.setup`). The environment is put back afterwards: `wandb_environment` writes os.environ itself."""
    import wandb

    saved = dict(os.environ)
    # The service a WANDB_SERVICE names is torn down below: restored, it would send every later subprocess (a
    # training launch, a traces command) looking for a socket that is gone.
    saved.pop("WANDB_SERVICE", None)
    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        del os.environ[name]
    os.environ["WANDB_MODE"] = "offline"
    wandb.teardown()
    yield
    wandb.teardown()
    os.environ.clear()
    os.environ.update(saved)


def test_redaction_rules_for_flags_and_urls():
    command = ["--api-key", KEY, "--hf-token", "--port", "8000", f"--token={KEY}", "--apikey", KEY, "--api-key", ""]
    assert redact_secrets(command) == [
        "--api-key", "***", "--hf-token", "--port", "8000", "--token=***", "--apikey", "***", "--api-key", "",
    ]  # a bare flag's next element is the next flag, kept; an empty value stays empty (no key was set)
    # the same inside one string: an override that sets a list, a shell-joined command
    assert redact_secrets(f"serve.extra_args=[--api-key, {KEY}, --port, 8000]") == (
        "serve.extra_args=[--api-key, ***, --port, 8000]"
    )
    assert redact_secrets(f"vllm serve m --api-key '{KEY}' --hf-token --port 8000") == (
        "vllm serve m --api-key '***' --hf-token --port 8000"
    )
    assert redact_secrets(URL) == SHOWN_URL  # scheme, host, port and path kept
    assert redact_secrets(f"https://{KEY}@hub.example/org/x?rev=1#a") == "https://***@hub.example/org/x?rev=1#a"
    assert redact_secrets(f"backend.base_urls=[http://h1:8000/v1, {URL}]") == (
        f"backend.base_urls=[http://h1:8000/v1, {SHOWN_URL}]"
    )
    # no user info, or no URL: untouched
    for text in ("http://127.0.0.1:8000/v1", "http://h/p?to=a@b", "mail me at a@b.c", "--port"):
        assert redact_secrets(text) == text


def test_suite_manifest_and_wandb_runs_hold_no_key(tmp_path, tiny_qwen3, monkeypatch, fresh_wandb):
    """`run_suite` with the key in a system's overrides (as a key, a URL password and a vLLM flag) and on the
    command line: suite.yaml, the results, the report and every file of the offline W&B runs are read back."""
    monkeypatch.setattr(sys, "argv", ARGV)
    from maps_train.evaluate.report import SUITE_MANIFEST
    from maps_train.evaluate.suite import run_suite

    write_jsonl(tmp_path / "data" / "nq" / "test.jsonl", [
        {"id": f"nq{i}", "question": f"who wrote book {i}", "golden_answers": [f"Author {i}"], "metadata": {}}
        for i in range(2)
    ])
    (tmp_path / "recipe.yaml").write_text(f"name: tiny\nroles:\n  default:\n    model: {tiny_qwen3}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""name: leak
out_dir: {tmp_path / 'out'}
data_root: {tmp_path / 'data'}
datasets: [{{name: nq}}]
systems:
  - name: vanilla
    recipe: recipe.yaml
    overrides: [agent.method=vanilla, "backend.api_key={KEY}", "backend.base_urls=[{URL}]",
                "serve.extra_args=[--api-key, {KEY}]"]
wandb: {{enabled: true, project: unit, mode: offline}}
""")
    run_suite(suite, runner=FixedAnswerRunner(), progress=False)

    out = tmp_path / "out"
    assert files_holding_the_key(out) == []
    manifest = (out / SUITE_MANIFEST).read_text()
    assert "backend.api_key=***" in manifest and SHOWN_URL in manifest and "[--api-key, ***]" in manifest
    import wandb

    wandb.teardown()  # waits for the service to close its streams: finish() may return before the writer flushed
    [run] = run_files(out / "wandb")
    logged = run.read_bytes()  # the run's config is there, redacted
    assert b'"api_key":"***"' in logged and SHOWN_URL.encode() in logged


def test_training_wandb_run_holds_no_command_line(tmp_path, monkeypatch, fresh_wandb):
    """Training's run is started by transformers' WandbCallback, with no settings of ours: only the environment
    that `wandb_environment` prepares keeps the command line (`-m maps_train.train ... backend.api_key=...`) out."""
    import wandb
    from transformers import TrainingArguments
    from transformers.integrations import WandbCallback
    from transformers.trainer_callback import TrainerState

    from maps_train.tracking import WandbConfig, wandb_environment

    monkeypatch.setattr(sys, "argv", ["maps_train/train/__main__.py", "recipe.yaml", "proposer", f"backend.api_key={KEY}"])
    assert wandb_environment(WandbConfig(enabled=True, mode="offline", dir=str(tmp_path / "wandb")), "g")
    callback = WandbCallback()
    callback.setup(TrainingArguments(output_dir=str(tmp_path / "out"), report_to=["wandb"]), TrainerState(), None)
    wandb.run.finish()

    assert run_files(tmp_path / "wandb"), "no offline run was written"
    assert files_holding_the_key(tmp_path / "wandb") == []


RECIPE = f"""train:
  student: {{student}}
  lora: {{{{r: 8}}}}
backend:
  max_model_len: 1024
  base_urls: ["{URL}"]
retrieval:
  service_url: "{URL.removesuffix('/v1')}"
serve:
  extra_args: [--api-key, {KEY}, "--hf-token={KEY}"]
"""


def invoke(*args: str):
    from maps_train.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_config_show_prints_no_key(tmp_path, tiny_qwen3):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(student=tiny_qwen3))
    shown = invoke("config", "show", str(recipe), f"backend.api_key={KEY}")
    assert MARKER.decode() not in shown
    assert f"- {SHOWN_URL}" in shown and "service_url: http://***@127.0.0.1:8000" in shown
    assert "- --api-key\n  - '***'" in shown and "--hf-token=***" in shown and "api_key: '***'" in shown


def test_serve_dry_run_prints_no_key(tmp_path, tiny_qwen3):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(student=tiny_qwen3))
    shown = invoke("serve", str(recipe), "--dry-run", "--adapters-later", "serve.port=8178")
    assert MARKER.decode() not in shown
    assert "--api-key '***' '--hf-token=***'" in shown  # the command's tail: serve.extra_args, shown redacted


def test_demo_writes_no_key_and_the_steps_still_get_it(tmp_path, repo_root, monkeypatch):
    """`maps-train demo backend.api_key=K`: recipe.yaml and suite.yaml, which every step reads, hold no key; the
    steps get it as $OPENAI_API_KEY, where the OpenAI client looks when backend.api_key is empty."""
    from maps_train.demo import prepare
    from maps_train.errors import MapsTrainError
    from maps_train.llm.openai_backend import api_key
    from maps_train.recipe import load_recipe

    monkeypatch.chdir(repo_root)
    recipe_path, suite_path, variables = prepare(tmp_path / "demo", True, [f"backend.api_key={KEY}"])
    assert files_holding_the_key(tmp_path / "demo") == []
    assert {recipe_path, suite_path} <= set((tmp_path / "demo").iterdir())
    assert variables == {"OPENAI_API_KEY": KEY}
    monkeypatch.setenv("OPENAI_API_KEY", variables["OPENAI_API_KEY"])
    assert api_key(load_recipe(str(recipe_path)).backend) == KEY

    # A secret the demo cannot move out of its recipe is refused (one line, the key not in it), nothing written.
    with pytest.raises(MapsTrainError) as refused:
        prepare(tmp_path / "other", True, [f"serve.extra_args=[--api-key, {KEY}]"])
    assert "\n" not in str(refused.value) and MARKER.decode() not in str(refused.value)
    assert not (tmp_path / "other").exists()


def test_printed_launch_command_holds_no_key(tmp_path, monkeypatch):
    """`maps-train train R backend.api_key=K` prints each `accelerate launch` command; the launch itself (a recording
    double: nothing trains here) still gets the override, which the training process needs."""
    from maps_train.errors import MapsTrainError
    from maps_train.train import launch

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"train:\n  student: builtin:tiny-qwen3\n  output_dir: {tmp_path / 'adapters'}\n")
    launched, printed = [], []
    monkeypatch.setattr(launch.subprocess, "call", lambda command: launched.append(command) or 1)
    overrides = [f"backend.api_key={KEY}", f"serve.extra_args=[--api-key, {KEY}]"]
    with pytest.raises(MapsTrainError) as failed:
        launch.train_all(str(recipe), "proposer", overrides, echo=printed.append)
    assert [command[-2:] for command in launched] == [overrides]
    assert len(printed) == 1 and MARKER.decode() not in printed[0] + str(failed.value)
    assert printed[0].endswith("backend.api_key=*** serve.extra_args=[--api-key, ***]")
