"""A URL password and a hub token appear in no output or file: the user info of `backend.base_urls` and
`retrieval.service_url` is hidden in every error and log line, and `hub_token` in `train.sft` or `rl.grpo` (which
the Trainer would pickle into every checkpoint's training_args.bin) is refused in a line that does not repeat it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from maps_train.config.redaction import install_log_redaction
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.openai_backend import OpenAIBackend
from maps_train.platform import free_port
from maps_train.recipe import BackendConfig, load_recipe
from maps_train.retrieval.client import RetrievalClient

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-pw"
TOKEN = "hf_NotARealTokenButSecret123"


def test_an_unreachable_backend_error_hides_the_urls_password():
    url = f"http://maps:{PASSWORD}@127.0.0.1:{free_port()}/v1"
    backend = OpenAIBackend(BackendConfig(base_urls=[url], max_retries=0, request_timeout_s=2))
    try:
        with pytest.raises(MapsTrainError) as err:
            backend.generate([ChatRequest(role="writer", messages=[{"role": "user", "content": "hi"}])])
    finally:
        backend.close()
    assert PASSWORD not in str(err.value) and "http://***@127.0.0.1:" in str(err.value)


def test_an_unreachable_retrieval_service_error_hides_the_urls_password():
    client = RetrievalClient(f"http://maps:{PASSWORD}@127.0.0.1:{free_port()}", timeout_s=2, retries=0)
    with pytest.raises(MapsTrainError) as err:
        client.search(["who?"], 2)
    assert PASSWORD not in str(err.value) and "http://***@127.0.0.1:" in str(err.value)


def test_log_lines_hide_a_urls_password(caplog, monkeypatch):
    install_log_redaction()
    # An earlier test's library (vLLM's logging config) may have disabled or detached the logger: not this test's
    # business, so it is made to reach caplog whatever ran before.
    monkeypatch.setattr(logging.getLogger("httpx"), "disabled", False)
    monkeypatch.setattr(logging.getLogger("httpx"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="httpx"):
        logging.getLogger("httpx").info('HTTP Request: %s %s "%s"', "POST", f"http://u:{PASSWORD}@h:1/v1", "200 OK")
    assert caplog.messages == ['HTTP Request: POST http://***@h:1/v1 "200 OK"']


def test_the_cli_shows_no_password_of_an_unreachable_backend(tmp_path):
    recipe = {
        "retrieval": {"corpus": str(REPO / "data/demo/corpus.jsonl"), "kind": "bm25",
                      "index_dir": str(tmp_path / "index")},
        "backend": {"base_urls": [f"http://maps:{PASSWORD}@127.0.0.1:{free_port()}/v1"], "max_retries": 0,
                    "request_timeout_s": 2},
        "roles": {"default": {"backend": "openai", "adapter": "teacher", "max_tokens": 8}},
        "agent": {"schedule": "step", "max_rounds": 1},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "maps_train.cli", "run", str(tmp_path / "recipe.yaml"), "--questions",
         str(REPO / "data/demo/test.jsonl"), "--out", str(tmp_path / "out"), "--limit", "2", "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "maps-train: error: backend.base_urls: http://***@127.0.0.1:" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and PASSWORD.encode() in path.read_bytes()
                and path.name != "recipe.yaml"]


def test_a_hub_token_in_train_sft_is_refused_and_written_nowhere(tmp_path, capsys):
    from test_train import write_recipe
    from toy_sft import write_toy_sft

    from maps_train.train.__main__ import main

    write_toy_sft(tmp_path / "sft")
    path = write_recipe(tmp_path / "r.yaml", tmp_path / "sft", tmp_path / "out",
                        sft={"max_steps": 1, "save_steps": 1, "hub_token": TOKEN})
    assert main(["--config", str(path), "--role", "writer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maps-train: error: train.sft.hub_token: a token in a recipe is saved with every "
                          "checkpoint's training_args.bin") and TOKEN not in err
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]


def test_a_hub_token_in_rl_grpo_is_refused():
    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import build_grpo_config

    recipe = load_recipe(None, [f"rl.grpo.hub_token={TOKEN}"])
    with pytest.raises(ConfigError) as err:
        build_grpo_config(RoleRun.of(recipe, "consolidator"), bf16=False, wandb_on=False)
    assert str(err.value).startswith("rl.grpo.hub_token: ") and TOKEN not in str(err.value)
