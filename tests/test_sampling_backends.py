"""One route's sampling reaches every backend the same (issue 46): in-process vLLM, a real `vllm serve` and
transformers each get the route's temperature, top_p, top_k, min_p, presence_penalty and repetition_penalty, and a
route that sets none of the last four gets their neutral values everywhere: not the model's generation_config.json
(Qwen3's says top_k 20, which `vllm serve` applied to unset fields and transformers kept, while in-process vLLM did
not). The tiny Qwen3 (vLLM-CPU's head size) is given Qwen3's generation_config.json values here."""

from __future__ import annotations

import json
import shutil

import pytest
from fixtures_llm import start_vllm_server

from maps_train.llm.types import ChatRequest
from maps_train.platform import free_port
from maps_train.recipe import BackendConfig, RoleRoute
from maps_train.serve.server import stop_process_group

pytestmark = pytest.mark.slow

SAMPLING = {"temperature": 0.6, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "presence_penalty": 0.5,
            "repetition_penalty": 1.1}
NEUTRAL = {"top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
QWEN3_GENERATION_CONFIG = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "bos_token_id": 0,
                           "eos_token_id": [1]}
MESSAGES = [{"role": "user", "content": "Name a city."}]


@pytest.fixture(scope="module")
def qwen3_like(tiny_qwen3_vllm, tmp_path_factory):
    """The vLLM-ready tiny Qwen3 with Qwen3's sampling in its generation_config.json."""
    folder = tmp_path_factory.mktemp("tiny-qwen3-genconfig") / "model"
    shutil.copytree(tiny_qwen3_vllm, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    eos = config.get("eos_token_id", 1)
    (folder / "generation_config.json").write_text(json.dumps({**QWEN3_GENERATION_CONFIG, "eos_token_id": eos}))
    return str(folder)


def routes(backend: str, model: str) -> list[RoleRoute]:
    base = {"backend": backend, "model": model, "max_tokens": 4, "seed": 3}
    return [RoleRoute(**base, **SAMPLING), RoleRoute(**base, temperature=0.6, top_p=0.9)]


def test_transformers_gets_the_routes_sampling_not_the_generation_config(qwen3_like):
    from maps_train.llm.hf_backend import HFBackend, PresencePenalty

    backend = HFBackend(qwen3_like, BackendConfig(dtype="float32", max_model_len=512))
    seen = []
    real = backend.model.generate

    def spy(**kwargs):
        gen = kwargs["generation_config"]
        penalties = [p.penalty for p in kwargs.get("logits_processor", []) if isinstance(p, PresencePenalty)]
        seen.append({"temperature": gen.temperature, "top_p": gen.top_p, "top_k": gen.top_k,
                     "min_p": gen.min_p or 0.0, "presence_penalty": penalties[0] if penalties else 0.0,
                     "repetition_penalty": gen.repetition_penalty})
        return real(**kwargs)

    backend.model.generate = spy
    for route in routes("hf", qwen3_like):
        backend.generate([ChatRequest(role="r", messages=MESSAGES)], [route])
    assert seen == [SAMPLING, {"temperature": 0.6, "top_p": 0.9, **NEUTRAL}]


def test_the_presence_penalty_of_transformers_is_vllms():
    import torch

    from maps_train.llm.hf_backend import PresencePenalty

    ids = torch.tensor([[5, 6, 2, 2, 3], [5, 6, 4, 0, 0]])  # a prompt of 2 columns, then each row's output
    scores = torch.zeros(2, 8)
    out = PresencePenalty(0.5, prompt_width=2)(ids, scores)
    assert out[0].tolist() == [0, 0, -0.5, -0.5, 0, 0, 0, 0]  # 2 counted once; the prompt's 5 and 6 not at all
    assert out[1].tolist() == [-0.5, 0, 0, 0, -0.5, 0, 0, 0]


def test_in_process_vllm_gets_the_routes_sampling(qwen3_like):
    from maps_train.llm.vllm_backend import VLLMBackend

    backend = VLLMBackend(qwen3_like, BackendConfig(dtype="float32", enforce_eager=True, max_model_len=512))
    try:
        loop = backend.loop
        real, seen = loop.generate, []

        def spy(prompts, params, loras):
            seen.extend(params)
            return real(prompts, params, loras)

        loop.generate = spy
        for route in routes("vllm", qwen3_like):
            backend.generate([ChatRequest(role="r", messages=MESSAGES)], [route])
    finally:
        backend.close()
    fields = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty")
    got = [{name: getattr(params, name) for name in fields} for params in seen]
    assert got == [pytest.approx(SAMPLING), pytest.approx({"temperature": 0.6, "top_p": 0.9, **NEUTRAL})]


def test_vllm_serve_gets_the_routes_sampling_not_the_generation_config(qwen3_like, tmp_path):
    from maps_train.llm.openai_backend import OpenAIBackend

    port, log = free_port(), tmp_path / "server.log"
    proc = start_vllm_server(qwen3_like, {}, port, log, timeout_s=600, extra_args=["--enable-log-requests"])
    try:
        backend = OpenAIBackend(BackendConfig(base_urls=[f"http://127.0.0.1:{port}/v1"], max_model_len=512))
        for route in routes("openai", qwen3_like):
            backend.generate([ChatRequest(role="r", messages=MESSAGES)], [route])
        backend.close()
    finally:
        stop_process_group(proc)
    received = [line for line in log.read_text().splitlines() if "Received request" in line]
    assert len(received) == 2
    for line, expected in zip(received, [SAMPLING, {"temperature": 0.6, "top_p": 0.9, **NEUTRAL}]):
        for name, value in expected.items():
            assert f"{name}={value}," in line or f"{name}={value})" in line, (name, value, line)
