"""Thinking as a per-role switch, end to end on the tiny Qwen3 (its real chat template, random weights).

What a random model writes cannot be steered, so generation is scripted where the text matters: `scripted_generate`
replaces the HF model's `generate` with one that decodes each prompt row, asks a script for the continuation and
returns its tokens. Everything around it is the real backend: chat template, raw continuation, tokenisation,
decoding, stop strings, the reasoning split and its token count. The vLLM backend runs on a stand-in `LLM` that
records the token prompts it is given (no engine starts here; the engine's own gate is checked on the session
engine and vLLM's parser in tests/test_llm_vllm.py); the OpenAI client runs against an in-process HTTP double.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend

from maps_train.agents.baselines.search_o1 import (
    BEGIN_QUERY,
    BEGIN_RESULT,
    END_QUERY,
    END_RESULT,
    SearchO1Engine,
    inside_thinking,
)
from maps_train.agents.maps import MapsEngine
from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.call_spec import call_spec
from maps_train.llm.rendering import join_continuation, render_prompt
from maps_train.llm.router import Router
from maps_train.llm.thinking import prompt_closes_thinking, prompt_opens_thinking, split_thinking
from maps_train.questions import Question
from maps_train.recipe import BackendConfig, RoleRoute, load_recipe
from maps_train.records.answer import Cost
from maps_train.records.trace import CallUsage

MSGS = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Capital of France?"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def qwen36_template(tokenizer) -> str:
    """The tiny Qwen3's template with Qwen3.6's generation prompt: it opens `<think>` itself when thinking."""
    template = tokenizer.chat_template
    closing = "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}"
    assert closing in template
    return template.replace(closing, "{{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- else %}\n        {{- '<think>\\n' }}\n    {%- endif %}")


@contextmanager
def scripted_generate(backend, script):
    """`backend.model.generate` replaced: each row's prompt text -> script(prompt) -> its tokens, then EOS."""
    import torch

    tok = backend.tokenizer
    real = backend.model.generate
    prompts: list[str] = []

    def generate(input_ids, attention_mask, generation_config, **kwargs):
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
            prompts.append(prompt)
            rows.append(tok(script(prompt), add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        width = max(len(r) for r in rows)
        new = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(new, dtype=input_ids.dtype)], dim=1)

    backend.model.generate = generate
    try:
        yield prompts
    finally:
        backend.model.generate = real


# -- the split and the prompt's state ---------------------------------------------------------------------------


def test_a_completion_that_starts_inside_think_is_split_when_the_prompt_opened_it():
    assert split_thinking("weighing it\n</think>\n\n{\"answer\": \"B\"}", opened=True) == ('{"answer": "B"}', "weighing it")
    assert split_thinking("cut off while weighing", opened=True) == ("", "cut off while weighing")
    assert split_thinking("Paris") == ("Paris", None)  # not opened: plain text stays the answer
    qwen3_on = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not prompt_opens_thinking(qwen3_on) and not prompt_closes_thinking(qwen3_on)
    assert prompt_opens_thinking(qwen3_on + "<think>\n")  # Qwen3.6's template
    assert prompt_closes_thinking(qwen3_on + "<think>\n\n</think>\n\n")  # thinking off
    # A raw continuation inside its reasoning, with a search result spliced in, is still inside the block.
    assert prompt_opens_thinking(qwen3_on + f"<think>\nplan {BEGIN_QUERY}q{END_QUERY}\n\n{BEGIN_RESULT}r{END_RESULT}")
    # Tags in the instructions (S3's and ParallelSearch's prompts mention <think>) do not count.
    assert not prompt_opens_thinking("<|im_start|>user\nReason inside <think>.<|im_end|>\n<|im_start|>assistant\n")
    # A turn written with its own <think> loses it where the template opened the block already.
    assert join_continuation(qwen3_on + "<think>\n", "<think>\nplan") == "plan"
    assert join_continuation(qwen3_on, "<think>\nplan") == "<think>\nplan"


def test_thinking_reaches_the_hf_prompt_and_a_raw_continuation_follows_the_generation_prompt(hf_tiny_qwen3):
    tok = hf_tiny_qwen3.tokenizer
    request = ChatRequest(role="answer", messages=MSGS)
    on = render_prompt(tok, call_spec(request, RoleRoute(enable_thinking=True)))
    off = render_prompt(tok, call_spec(request, RoleRoute(enable_thinking=False)))
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on  # the model opens it itself
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # the template closes an empty one
    raw = ChatRequest(role="reasoner", messages=MSGS, raw_continuation="<think>\nFrance... ")
    assert render_prompt(tok, call_spec(raw, RoleRoute(enable_thinking=True))) == on + "<think>\nFrance... "
    both = ChatRequest(role="r", messages=MSGS, raw_continuation="x", continue_final_message=True)
    with pytest.raises(MapsTrainError, match="not both"):
        render_prompt(tok, call_spec(both, RoleRoute()))


def test_hf_backend_splits_reasoning_before_the_json_and_counts_its_tokens(hf_tiny_qwen3, tiny_qwen3):
    route = RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=64, enable_thinking=True)
    reply = '<think>\nParis is the capital.\n</think>\n\n{"answer": "Paris"}'
    with scripted_generate(hf_tiny_qwen3, lambda prompt: reply) as prompts:
        (comp,) = hf_tiny_qwen3.generate([ChatRequest(role="answer", messages=MSGS, json_schema=SCHEMA)], [route])
    assert prompts[0].endswith("<|im_start|>assistant\n")
    assert json.loads(comp.text) == {"answer": "Paris"} and comp.reasoning == "Paris is the capital."
    tok = hf_tiny_qwen3.tokenizer
    thinking = len(tok("<think>\nParis is the capital.\n</think>", add_special_tokens=False)["input_ids"])
    assert comp.reasoning_tokens == thinking and comp.completion_tokens > thinking


def test_hf_backend_reads_a_reply_that_starts_inside_a_think_block_the_template_opened(hf_tiny_qwen3, tiny_qwen3):
    tok = hf_tiny_qwen3.tokenizer
    saved = tok.chat_template
    tok.chat_template = qwen36_template(tok)
    route = RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=64, enable_thinking=True)
    try:
        with scripted_generate(hf_tiny_qwen3, lambda p: "Paris, surely.\n</think>\n\nParis") as prompts:
            (comp,) = hf_tiny_qwen3.generate([ChatRequest(role="answer", messages=MSGS)], [route])
        with scripted_generate(hf_tiny_qwen3, lambda p: "still weighing the options") as _:
            (cut,) = hf_tiny_qwen3.generate([ChatRequest(role="answer", messages=MSGS)], [route])
        turn = ChatRequest(role="reasoner", messages=MSGS, raw_continuation="<think>\nFrance: ")
        assert render_prompt(tok, call_spec(turn, route)).endswith("<|im_start|>assistant\n<think>\nFrance: ")
    finally:
        tok.chat_template = saved
    assert prompts[0].endswith("<|im_start|>assistant\n<think>\n")
    assert (comp.text, comp.reasoning) == ("Paris", "Paris, surely.")
    assert (cut.text, cut.reasoning) == ("", "still weighing the options") and cut.reasoning_tokens == cut.completion_tokens


# -- vLLM: what the engine is started with and given -----------------------------------------------------------


class StandInLLM:
    """Test double of `vllm.LLM` as the engine loop drives it (`enqueue`, `llm_engine.step`): records the prompts
    and sampling it was given; every request finishes at the next step with the scripted text, tokenised."""

    def __init__(self, tokenizer, reply: str):
        self.tokenizer, self.reply, self.prompts, self.params = tokenizer, reply, [], []
        self.pending, self.count = [], 0
        self.llm_engine = SimpleNamespace(has_unfinished_requests=lambda: bool(self.pending), step=self._step)

    def enqueue(self, prompts, params, lora_request=None, use_tqdm=False):
        self.prompts += [self.tokenizer.decode(p["prompt_token_ids"]) for p in prompts]
        self.params += list(params)
        ids = []
        for prompt in prompts:
            self.count += 1
            self.pending.append((str(self.count), prompt))
            ids.append(f"{self.count}-abcdefgh")  # vLLM's internal id: the external one plus a random suffix
        return ids

    def _step(self):
        ids = self.tokenizer(self.reply, add_special_tokens=False)["input_ids"]
        sample = SimpleNamespace(text=self.reply, token_ids=ids, finish_reason="stop", stop_reason=None)
        done, self.pending = self.pending, []
        return [SimpleNamespace(request_id=rid, finished=True, outputs=[sample], prompt_token_ids=p["prompt_token_ids"])
                for rid, p in done]


def stand_in_vllm(model: str, reply: str, thinking: bool, parser: bool):
    from transformers import AutoTokenizer

    from maps_train.llm.vllm_backend import VLLMBackend

    backend = VLLMBackend(model, BackendConfig(dtype="float32", max_model_len=1024), thinking=thinking)
    backend._tokenizer = AutoTokenizer.from_pretrained(backend.path)
    backend._llm = StandInLLM(backend._tokenizer, reply)
    backend._started_with_parser = parser
    return backend


def test_vllm_engine_gets_the_qwen3_reasoning_parser_only_where_a_route_thinks_and_the_model_can(tiny_qwen3, smollm2):
    from maps_train.llm.router import make_backend

    config = BackendConfig(dtype="float32")
    thinking = make_backend("vllm", tiny_qwen3, [RoleRoute(model=tiny_qwen3, enable_thinking=True)], config)
    plain = make_backend("vllm", tiny_qwen3, [RoleRoute(model=tiny_qwen3)], config)
    smol = make_backend("vllm", smollm2, [RoleRoute(model=smollm2, enable_thinking=True)], config)
    assert thinking.llm_kwargs()["reasoning_parser"] == "qwen3"
    assert "reasoning_parser" not in plain.llm_kwargs()
    assert "reasoning_parser" not in smol.llm_kwargs()  # no </think> token: the grammar gate would never open


def test_vllm_backend_renders_thinking_and_splits_reasoning_before_the_json(tiny_qwen3):
    reply = '<think>\nParis.\n</think>\n\n{"answer": "Paris"}'
    backend = stand_in_vllm(tiny_qwen3, reply, thinking=True, parser=True)
    on, off = RoleRoute(model=tiny_qwen3, enable_thinking=True), RoleRoute(model=tiny_qwen3, enable_thinking=False)
    requests = [ChatRequest(role="answer", messages=MSGS, json_schema=SCHEMA) for _ in range(2)]
    first, second = backend.generate(requests, [on, off])
    sent_on, sent_off = backend._llm.prompts
    assert sent_on.endswith("<|im_start|>assistant\n") and sent_off.endswith("<think>\n\n</think>\n\n")
    assert backend._llm.params[0].structured_outputs.json == SCHEMA  # the grammar; the engine starts it after </think>
    assert json.loads(first.text) == {"answer": "Paris"} and first.reasoning == "Paris." and first.constrained
    tok = backend.tokenizer
    assert first.reasoning_tokens == len(tok("<think>\nParis.\n</think>", add_special_tokens=False)["input_ids"])
    raw = ChatRequest(role="reasoner", messages=MSGS, raw_continuation="<think>\nFrance: ")
    backend.generate([raw], [on])
    assert backend._llm.prompts[-1] == sent_on + "<think>\nFrance: "


def test_vllm_backend_refuses_a_constrained_row_whose_grammar_would_start_in_the_wrong_place(tiny_qwen3):
    request = ChatRequest(role="answer", messages=MSGS, json_schema=SCHEMA)
    no_parser = stand_in_vllm(tiny_qwen3, "{}", thinking=False, parser=False)
    with pytest.raises(MapsTrainError, match="roles.answer.enable_thinking: .*without a reasoning parser"):
        no_parser.generate([request], [RoleRoute(model=tiny_qwen3, enable_thinking=True)])
    parser = stand_in_vllm(tiny_qwen3, "{}", thinking=True, parser=True)
    tok = parser.tokenizer
    saved = tok.chat_template
    tok.chat_template = saved.replace("{{- '<think>\\n\\n</think>\\n\\n' }}", "")  # a template without the empty block
    try:
        with pytest.raises(MapsTrainError, match="grammar would never start"):
            parser.generate([request], [RoleRoute(model=tiny_qwen3, enable_thinking=False)])
    finally:
        tok.chat_template = saved


# -- OpenAI-compatible client --------------------------------------------------------------------------------------


def openai_double(replies: dict[str, dict]):
    """An httpx transport answering /models, /chat/completions and /completions; records every JSON body."""
    import httpx

    bodies: list[tuple[str, dict]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "base", "object": "model"}]})
        body = json.loads(request.content)
        kind = "completions" if path.endswith("/v1/completions") else "chat"
        bodies.append((kind, body))
        return httpx.Response(200, json=replies[kind])

    return httpx.MockTransport(handle), bodies


def chat_reply(content, reasoning=None, reasoning_tokens=None):
    usage = {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "base", "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def completion_reply(text):
    return {"id": "y", "object": "text_completion", "created": 0, "model": "base",
            "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}


@contextmanager
def openai_backend(replies):
    import httpx
    from openai import AsyncOpenAI

    from maps_train.llm.openai_backend import OpenAIBackend

    transport, bodies = openai_double(replies)
    backend = OpenAIBackend(BackendConfig(base_urls=["http://double/v1"], max_retries=0))
    url = backend.urls[0]
    backend._clients[url] = AsyncOpenAI(base_url=url, api_key="x", http_client=httpx.AsyncClient(transport=transport))
    try:
        yield backend, bodies
    finally:
        backend.close()


def test_openai_client_sends_the_thinking_switch_and_takes_the_servers_reasoning(tiny_qwen3):
    replies = {"chat": chat_reply('{"answer": "Paris"}', reasoning="Paris.", reasoning_tokens=5)}
    with openai_backend(replies) as (backend, bodies):
        on = RoleRoute(backend="openai", model=tiny_qwen3, enable_thinking=True)
        off = RoleRoute(backend="openai", model=tiny_qwen3, enable_thinking=False)
        first, _ = backend.generate([ChatRequest(role="answer", messages=MSGS, json_schema=SCHEMA)] * 2, [on, off])
    # Requests run concurrently: their order at the server is not the batch's.
    sent = sorted(b["chat_template_kwargs"]["enable_thinking"] for _, b in bodies)
    assert sent == [False, True] and all(b["structured_outputs"] == {"json": SCHEMA} for _, b in bodies)
    assert (first.text, first.reasoning, first.reasoning_tokens) == ('{"answer": "Paris"}', "Paris.", 5)


def test_openai_client_splits_where_the_server_did_not(tiny_qwen3):
    replies = {"chat": chat_reply('<think>\nParis.\n</think>\n\n{"answer": "Paris"}')}
    with openai_backend(replies) as (backend, _):
        route = RoleRoute(backend="openai", model=tiny_qwen3, enable_thinking=True)
        (comp,) = backend.generate([ChatRequest(role="answer", messages=MSGS)], [route])
    assert (comp.text, comp.reasoning) == ('{"answer": "Paris"}', "Paris.")
    assert 0 < comp.reasoning_tokens < comp.completion_tokens  # estimated: the server counted none


def test_openai_client_sends_a_raw_continuation_as_the_rendered_prompt_to_completions(tiny_qwen3, hf_tiny_qwen3):
    replies = {"completions": completion_reply("more thought\n</think>\n\n\\boxed{Paris}"), "chat": chat_reply("Paris")}
    route = RoleRoute(backend="openai", model=tiny_qwen3, enable_thinking=True, max_tokens=32)
    turn = f"<think>\nplan {BEGIN_QUERY}q{END_QUERY}\n\n{BEGIN_RESULT}Paris{END_RESULT}\n\n"
    request = ChatRequest(role="reasoner", messages=MSGS, raw_continuation=turn, stop=[END_QUERY])
    with openai_backend(replies) as (backend, bodies):
        (comp,) = backend.generate([request], [route])
    ((kind, body),) = bodies
    expected = render_prompt(hf_tiny_qwen3.tokenizer, call_spec(ChatRequest(role="r", messages=MSGS), route)) + turn
    assert kind == "completions" and body["prompt"] == expected and body["add_special_tokens"] is False
    assert "messages" not in body and "chat_template_kwargs" not in body and body["stop"] == [END_QUERY]
    assert (comp.text, comp.reasoning) == ("\\boxed{Paris}", "more thought") and comp.reasoning_tokens > 0
    unknown = RoleRoute(backend="openai", model="no-such-org/no-such-model", enable_thinking=True)
    with openai_backend(replies) as (backend, bodies):
        with pytest.raises(MapsTrainError, match="roles.reasoner.model: 'no-such-org/no-such-model' has no tokenizer"):
            backend.generate([request], [unknown])
        (chat,) = backend.generate([ChatRequest(role="answer", messages=MSGS)], [unknown])
    assert bodies[-1][0] == "chat" and chat.text == "Paris"  # a thinking chat request needs no local template


# -- the agents: Search-o1's raw turn, MAPS's thinking answer, and what the records keep ----------------------------


def o1_script(prompt: str) -> str:
    """The reasoner searches after its thinking on the first turn (past the stop string, which the backend cuts)
    and thinks again, then answers, on the second; the condenser (thinking off) condenses."""
    if "paused in the middle of its reasoning" in prompt:
        return "**Final Information**\n\nGustave Eiffel was born in Dijon."
    if BEGIN_RESULT not in prompt.rsplit("<|im_start|>assistant", 1)[-1]:
        return (f"<think>\nI need the engineer's birthplace.\n</think>\n\n{BEGIN_QUERY}Gustave Eiffel birthplace"
                f"{END_QUERY} trailing")
    return "<think>\nSo he was born in Dijon.\n</think>\n\nThe answer is \\boxed{Dijon}."


def test_search_o1_with_thinking_continues_its_own_turn_raw_with_the_results_after_the_reasoning(
    hf_tiny_qwen3, tiny_qwen3
):
    recipe = load_recipe(None, ["agent.method=search_o1", "agent.top_k=2"])
    routes = {
        "default": RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=96),
        "reasoner": RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=96, enable_thinking=True),
    }
    recipe.roles = routes
    recording = ScriptedBackend()  # unused scripts; records what the router is asked
    router = Router(routes, backends={"hf": hf_tiny_qwen3})

    class Recording:
        def generate(self, requests):
            recording.batches.append(list(requests))
            return router.generate(requests)

    engine = SearchO1Engine(recipe, Recording(), RecordingRetriever())
    with scripted_generate(hf_tiny_qwen3, o1_script) as prompts:
        (trace,) = engine.run_batch([Question(id="q0", question="Where was the Eiffel Tower's engineer born?")])

    first, second = recording.requests("reasoner")
    assert first.raw_continuation is None and first.messages[-1]["role"] == "user"
    # The second turn: the conversation as before, the model's own turn (reasoning, query, result) as raw text.
    turn = (
        f"<think>\nI need the engineer's birthplace.\n</think>\n\n{BEGIN_QUERY}Gustave Eiffel birthplace{END_QUERY}"
        f"\n\n{BEGIN_RESULT}Gustave Eiffel was born in Dijon.{END_RESULT}\n\n"
    )
    assert second.raw_continuation == turn and second.messages == first.messages
    assert not second.continue_final_message and not inside_thinking(turn)
    sent = [p for p in prompts if BEGIN_RESULT in p.rsplit("<|im_start|>assistant", 1)[-1]]  # not the instructions
    assert sent == [render_prompt(hf_tiny_qwen3.tokenizer, call_spec(first, routes["reasoner"])) + turn]
    assert sent[0].count("<|im_start|>assistant") == 1 and sent[0].count("</think>") == 1  # one turn
    # The trace keeps the partial turn as the last (assistant) message, the query read after the reasoning.
    calls = [c for r in trace.rounds for c in r.calls if c.role == "reasoner"]
    assert calls[1].messages[-1] == {"role": "assistant", "content": turn}
    assert calls[0].parsed == {"query": "Gustave Eiffel birthplace"} and calls[0].parse_ok
    assert calls[0].raw_text == f"{BEGIN_QUERY}Gustave Eiffel birthplace"
    assert calls[0].reasoning == "I need the engineer's birthplace."
    assert [r.extra["action"] for r in trace.rounds] == ["search", "answer"] and trace.final_answer == "Dijon"
    assert calls[1].reasoning == "So he was born in Dijon." and calls[1].raw_text == "The answer is \\boxed{Dijon}."
    # The reasoning tokens are booked on each call and on the cost (agents/engine.py's usage_of passes them on).
    assert 0 < calls[0].usage.reasoning_tokens < calls[0].usage.completion_tokens
    assert 0 < calls[1].usage.reasoning_tokens < calls[1].usage.completion_tokens
    assert trace.cost.by_role["reasoner"].reasoning_tokens == sum(c.usage.reasoning_tokens for c in calls)


def test_search_o1_without_thinking_continues_its_turn_raw_too(tiny_qwen3):
    recipe = load_recipe(None, ["agent.method=search_o1", "agent.top_k=2"])
    scripts = {
        "reasoner": lambda r, t: f"Look it up.\n{BEGIN_QUERY}Eiffel" if t == 0 else "\\boxed{Dijon}",
        "condenser": lambda r, t: "**Final Information**\n\nDijon.",
    }
    backend = ScriptedBackend(scripts)
    SearchO1Engine(recipe, backend, RecordingRetriever()).run_batch([Question(id="q0", question="Where?")])
    second = backend.requests("reasoner")[1]
    assert not second.continue_final_message and second.raw_continuation.startswith(f"Look it up.\n{BEGIN_QUERY}")
    assert second.messages[-1]["role"] == "user"


def test_maps_answer_thinks_then_its_json_is_parsed_and_the_reasoning_is_recorded(hf_tiny_qwen3, tiny_qwen3):
    recipe = load_recipe(None, ["agent.num_directions=1", "agent.max_rounds=1", "agent.top_k=2"])
    routes = {
        "default": RoleRoute(backend="hf", model="scripted"),
        "answer": RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=64, enable_thinking=True),
    }
    recipe.roles = routes
    scripted = ScriptedBackend()

    class Scripted:
        def generate(self, requests, routes=None):
            return scripted.generate(requests)

    router = Router(routes, backends={"hf:scripted": Scripted(), f"hf:{tiny_qwen3}": hf_tiny_qwen3})
    reply = '<think>\nThe passages say Dijon.\n</think>\n\n{"answer": "Dijon"}'
    with scripted_generate(hf_tiny_qwen3, lambda prompt: reply) as prompts:
        (trace,) = MapsEngine(recipe, router, RecordingRetriever()).run_batch([Question(id="q0", question="Where?")])
    assert prompts[0].endswith("<|im_start|>assistant\n")  # thinking on for the answer role only
    final = trace.final_call
    assert final.parsed == {"answer": "Dijon"} and final.parse_ok and trace.final_answer == "Dijon"
    assert final.raw_text == '{"answer": "Dijon"}' and final.reasoning == "The passages say Dijon."
    assert final.usage.reasoning_tokens > 0
    assert trace.cost.by_role["answer"].reasoning_tokens == final.usage.reasoning_tokens
    assert trace.cost.reasoning_tokens == final.usage.reasoning_tokens
    assert trace.cost.by_role["proposer"].reasoning_tokens == 0


def test_reasoning_tokens_are_a_cost_column_of_their_own_and_old_records_load():
    cost = Cost()
    cost.add_completion("answer", 100, 40, 30)
    cost.add_completion("answer", 100, 10)
    cost.add_completion("proposer", 50, 5)
    data = cost.to_dict()
    assert data["reasoning_tokens"] == 30 and data["by_role"]["answer"]["reasoning_tokens"] == 30
    assert data["completion_tokens"] == 55  # reasoning is part of the completion, counted again on its own
    assert Cost.from_dict(data) == cost
    old = {"calls": 1, "prompt_tokens": 3, "completion_tokens": 2, "by_role": {"a": {"calls": 1, "prompt_tokens": 3,
                                                                                       "completion_tokens": 2}}}
    assert Cost.from_dict(old).reasoning_tokens == 0 and Cost.from_dict({"completion_tokens": 4}).reasoning_tokens == 0
    usage = CallUsage(prompt_tokens=3, completion_tokens=9, reasoning_tokens=7)
    from dataclasses import asdict

    assert CallUsage.from_dict(asdict(usage)) == usage
    assert CallUsage.from_dict({"prompt_tokens": 3, "completion_tokens": 2, "latency_s": 0.1}).reasoning_tokens == 0


def test_serve_plan_adds_the_reasoning_parser_when_the_served_routes_think(tmp_path, tiny_qwen3, make_lora_adapters):
    import shutil

    from maps_train.serve import plan_server

    shared = make_lora_adapters(tiny_qwen3, ["shared"])["shared"]
    shutil.copytree(shared, tmp_path / "adapters" / "shared")
    base = [f"train.student={tiny_qwen3}", f"train.output_dir={tmp_path / 'adapters'}", "train.shared_adapter=true"]
    thinking = plan_server(load_recipe(None, [*base, "sft_data.enable_thinking=true"])).command
    plain = plan_server(load_recipe(None, [*base, "sft_data.enable_thinking=false"])).command
    assert thinking[thinking.index("--reasoning-parser") + 1] == "qwen3" and "--reasoning-parser" not in plain


# -- the paper recipes state their thinking ----------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["recipes/paper/qwen3-32b.yaml", "recipes/paper/qwen3.6-35b-a3b.yaml"])
def test_config_show_of_the_paper_recipes_states_thinking_for_every_role(recipe, repo_root):
    import yaml
    from typer.testing import CliRunner

    from maps_train.cli import app

    result = CliRunner().invoke(app, ["config", "show", str(repo_root / recipe)])
    assert result.exit_code == 0, result.output
    roles = yaml.safe_load(result.output)["roles"]
    assert {role: route["enable_thinking"] for role, route in roles.items()} == {
        "default": False, "answer": True, "generator": True, "reasoner": True,
    }
    # One reasoning budget and one sampling for every thinking role.
    thinking = [route for route in roles.values() if route["enable_thinking"]]
    assert {(r["max_tokens"], r["temperature"], r["top_p"], r["seed"]) for r in thinking} == {(8192, 0.6, 0.95, 0)}
    model = "Qwen/Qwen3-32B" if "32b" in recipe else "Qwen/Qwen3.6-35B-A3B"
    assert {route["model"] for route in roles.values()} == {model}
