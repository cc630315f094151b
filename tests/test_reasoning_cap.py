"""Calls whose reasoning hits max_tokens: counted per role in traces and reports, and (`backend.reasoning_cap:
answer`) answered by a follow-up that closes the reasoning, with both calls' tokens on the question's cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_backend import RecordingBackend
from transformers import AutoTokenizer

from maps_train.agents.engine import Engine, PendingCall, QuestionRun
from maps_train.agents.jsonparse import Parsed
from maps_train.errors import MapsTrainError
from maps_train.evaluate.report import write_markdown
from maps_train.evaluate.summary import summarize
from maps_train.llm.budget import REASONING_CAP_CLOSE, ReasoningCap
from maps_train.llm.call_spec import call_spec
from maps_train.llm.rendering import render_prompt
from maps_train.llm.router import Router
from maps_train.llm.thinking import prompt_closes_thinking
from maps_train.llm.types import ChatRequest, Completion
from maps_train.questions import Question
from maps_train.recipe import Recipe, RoleRoute, load_recipe
from maps_train.records.answer import Cost
from maps_train.records.trace import CallUsage

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "Which city is the capital of France?"}]
CAPPED_REASONING = "The question asks for a capital.\n\n  France's capital is"  # inner spaces kept byte for byte
ANSWER = json.dumps({"answer": "Paris"})


class CappedThinkingBackend:
    """Test double for a thinking model that runs out of tokens while thinking: a first call comes back cut inside
    `<think>` (reasoning, no answer, finish "length"); a call continuing the turn after the closed reasoning
    answers. Logs every request it got. A real model cannot be made to stop at a chosen point of its reasoning."""

    def __init__(self):
        self.requests: list[ChatRequest] = []

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        self.requests.extend(requests)
        return [self._reply(request) for request in requests]

    @staticmethod
    def _reply(request: ChatRequest) -> Completion:
        if request.raw_continuation and REASONING_CAP_CLOSE in request.raw_continuation:  # the forced answer
            return Completion(text=ANSWER, prompt_tokens=90, completion_tokens=7, latency_s=0.5, finish_reason="stop")
        if request.role == "long_answer":  # no thinking: the answer itself is cut
            return Completion(text='{"answer": "Par', prompt_tokens=20, completion_tokens=8, finish_reason="length")
        return Completion(
            text="", reasoning=CAPPED_REASONING, prompt_tokens=20, completion_tokens=64, reasoning_tokens=64,
            latency_s=2.0, finish_reason="length",
        )


def _router(backend, policy: str = "answer") -> Router:
    routes = {"default": RoleRoute(backend="hf", model="scripted", enable_thinking=True, max_tokens=64)}
    return Router(routes, backends={"hf": backend}, reasoning_cap=ReasoningCap(policy=policy, answer_tokens=32))


def _answer_plan(run: QuestionRun, role: str = "answer") -> PendingCall:
    def parse(text: str) -> Parsed:
        try:
            return Parsed(json.loads(text), True)
        except ValueError:
            return Parsed({"answer": ""}, False, "not JSON")

    return PendingCall(run=run, role=role, messages=MESSAGES, parse=parse)


def test_a_capped_reasoning_is_closed_and_answered_by_a_follow_up_that_continues_the_turn():
    backend = CappedThinkingBackend()
    [completion] = _router(backend).generate([ChatRequest(role="answer", messages=MESSAGES, question_id="q1")])
    first, follow_up = backend.requests
    assert first.raw_continuation is None
    assert follow_up.raw_continuation == f"<think>\n{CAPPED_REASONING}{REASONING_CAP_CLOSE}"
    assert follow_up.messages == MESSAGES and follow_up.max_tokens == 32 and follow_up.question_id == "q1"
    assert completion.text == ANSWER and completion.reasoning_capped and completion.finish_reason == "stop"
    assert completion.reasoning.startswith(CAPPED_REASONING)
    assert (completion.prompt_tokens, completion.completion_tokens, completion.reasoning_tokens) == (110, 71, 64)
    assert completion.latency_s == 2.5


def test_a_raw_turn_that_was_capped_keeps_its_text_in_front_of_the_reasoning():
    backend = CappedThinkingBackend()
    turn = "<think>\nSearching first."
    _router(backend).generate([ChatRequest(role="reasoner", messages=MESSAGES, raw_continuation=turn)])
    assert backend.requests[1].raw_continuation == f"{turn}{CAPPED_REASONING}{REASONING_CAP_CLOSE}"


def test_a_raw_turn_past_its_reasoning_opens_a_new_block_for_the_capped_one():
    """A turn whose last think block is closed (a tool result spliced after it): the capped reasoning began with
    its own `<think>`, which the split took off, so it is put back before the reasoning."""
    backend = CappedThinkingBackend()
    turn = "<think>\nFirst.\n</think>\n\n<information>Doc 1</information>\n\n"
    _router(backend).generate([ChatRequest(role="reasoner", messages=MESSAGES, raw_continuation=turn)])
    assert backend.requests[1].raw_continuation == f"{turn}<think>\n{CAPPED_REASONING}{REASONING_CAP_CLOSE}"


class ExactTextBackend(CappedThinkingBackend):
    """The same double, for a backend that reports its exact generated text (`Completion.generated`): the capped
    call wrote its reasoning with spacing that the split would lose."""

    GENERATED = "<think>The question asks for a capital.\n\n  France's capital is"

    def _reply(self, request: ChatRequest) -> Completion:
        completion = super()._reply(request)
        completion.generated = self.GENERATED if completion.finish_reason == "length" else completion.text
        return completion


def test_the_follow_up_continues_from_exactly_what_the_capped_call_generated():
    backend = ExactTextBackend()
    turn = "<think>\nFirst.\n</think>\n\n<information>Doc 1</information>\n\n"
    [completion] = _router(backend).generate([ChatRequest(role="reasoner", messages=MESSAGES, raw_continuation=turn)])
    assert backend.requests[1].raw_continuation == f"{turn}{ExactTextBackend.GENERATED}{REASONING_CAP_CLOSE}"
    assert completion.generated == f"{ExactTextBackend.GENERATED}{REASONING_CAP_CLOSE}{ANSWER}"


def test_policy_none_keeps_the_empty_answer_but_still_marks_the_call():
    backend = CappedThinkingBackend()
    [completion] = _router(backend, "none").generate([ChatRequest(role="answer", messages=MESSAGES)])
    assert len(backend.requests) == 1
    assert completion.text == "" and completion.reasoning_capped and completion.finish_reason == "length"


def test_caps_are_counted_per_role_in_the_trace_the_cost_and_the_report(tmp_path):
    engine = Engine(Recipe(), _router(CappedThinkingBackend()), retriever=None)
    run = QuestionRun(Question(id="q1", question=MESSAGES[0]["content"], golden_answers=["Paris"], dataset="toy"))
    (capped, parsed), (cut, _) = engine.call_roles([_answer_plan(run), _answer_plan(run, "long_answer")])

    assert parsed.ok and parsed.value == {"answer": "Paris"}  # the forced answer is what the role parses
    assert capped.usage.reasoning_capped and capped.usage.length_capped
    assert (capped.usage.prompt_tokens, capped.usage.completion_tokens) == (110, 71)
    assert not cut.usage.reasoning_capped and cut.usage.length_capped
    assert CallUsage.from_dict(capped.usage.__dict__) == capped.usage  # the trace reads back
    by_role = run.cost.by_role
    assert (by_role["answer"].completion_tokens, by_role["answer"].reasoning_capped_calls) == (71, 1)
    assert (by_role["long_answer"].reasoning_capped_calls, by_role["long_answer"].length_capped_calls) == (0, 1)
    cost = Cost.from_dict(run.cost.to_dict())
    assert (cost.reasoning_capped_calls, cost.length_capped_calls) == (1, 2)

    row = {"system": "maps", "dataset": "toy", "question_id": "q1", "cost": run.cost.to_dict(), "compute_flops": None}
    summary = summarize([row, {**row, "question_id": "q2"}])
    assert summary["cells"]["maps"]["Avg"]["caps"]["by_role"]["answer"] == {
        "reasoning_capped_calls": 2, "length_capped_calls": 2, "stops_in_reasoning": 0
    }
    write_markdown(summary, tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert "| maps | answer | 2 | 2 | 0 |" in report
    assert "| maps | long_answer | 0 | 2 | 0 |" in report
    assert "| maps | all | 2 | 4 | 0 |" in report


def test_tiny_qwen3_cut_inside_its_reasoning_is_counted_and_the_follow_up_runs(hf_tiny_qwen3, tiny_qwen3):
    recording = RecordingBackend(hf_tiny_qwen3)
    routes = {"default": RoleRoute(backend="hf", model=tiny_qwen3, enable_thinking=True, max_tokens=4)}
    router = Router(routes, backends={"hf": recording}, reasoning_cap=ReasoningCap(answer_tokens=3))
    turn = "<think>\nLet me see. "  # the reply opens its reasoning; random weights never close it in 4 tokens
    [completion] = router.generate([ChatRequest(role="answer", messages=MESSAGES, raw_continuation=turn)])

    assert [len(batch) for batch in recording.batches] == [1, 1]
    [[follow_up]] = recording.batches[1:]
    assert follow_up.raw_continuation.startswith(turn) and follow_up.raw_continuation.endswith(REASONING_CAP_CLOSE)
    assert follow_up.max_tokens == 3
    assert completion.reasoning_capped
    assert 4 < completion.completion_tokens <= 7 and completion.reasoning_tokens == 4


# -- Qwen3.6-35B-A3B at first contact: its real template (tests/fixtures/chat_templates/qwen3_6.jinja, copied from
# TRL's trl/chat_templates/qwen3_6.jinja) and a text-only engine ------------------------------------------------

QWEN36_RECIPE = REPO / "recipes" / "paper" / "qwen3.6-35b-a3b.yaml"
QWEN36_TEMPLATE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen3_6.jinja"
SYSTEM = [{"role": "system", "content": "You answer questions."}, *MESSAGES]


def _qwen36_tokenizer(tiny_qwen3):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    tokenizer.chat_template = QWEN36_TEMPLATE.read_text()
    return tokenizer


def test_every_role_of_the_qwen36_recipe_renders_through_its_template_thinking_on_and_off(tiny_qwen3):
    recipe = load_recipe(str(QWEN36_RECIPE))
    tokenizer = _qwen36_tokenizer(tiny_qwen3)
    assert {"default", "answer", "generator", "reasoner"} <= set(recipe.roles)
    for role in recipe.roles:
        for thinking in (True, False):
            request = ChatRequest(role=role, messages=SYSTEM, chat_template_kwargs={"enable_thinking": thinking})
            prompt = render_prompt(tokenizer, call_spec(request, recipe.route(role)))
            assert prompt.startswith("<|im_start|>system\nYou answer questions.<|im_end|>\n")
            assert MESSAGES[0]["content"] in prompt
            # Qwen3.6 opens the block in the prompt when thinking, and writes it empty and closed when not.
            expected_end = "<|im_start|>assistant\n<think>\n" if thinking else "<think>\n\n</think>\n\n"
            assert prompt.endswith(expected_end), (role, thinking, prompt[-60:])
        route_thinks = recipe.route(role).enable_thinking
        assert render_prompt(tokenizer, call_spec(ChatRequest(role=role, messages=SYSTEM), recipe.route(role))) \
            .endswith("<think>\n" if route_thinks else "</think>\n\n")


def test_the_forced_answer_follow_up_renders_one_think_block_under_the_qwen36_template(tiny_qwen3):
    recipe = load_recipe(str(QWEN36_RECIPE))
    request = ChatRequest(role="answer", messages=SYSTEM)
    capped = Completion(text="", reasoning=CAPPED_REASONING, finish_reason="length")
    follow_up = ReasoningCap().follow_up(request, capped)
    prompt = render_prompt(_qwen36_tokenizer(tiny_qwen3), call_spec(follow_up, recipe.route("answer")))
    turn = prompt[prompt.rindex("<|im_start|>assistant\n"):]
    assert turn == f"<|im_start|>assistant\n<think>\n{CAPPED_REASONING}{REASONING_CAP_CLOSE}"
    assert prompt_closes_thinking(prompt)  # what the model writes next is read as the answer


def test_the_qwen36_engine_and_server_skip_the_vision_encoder(tmp_path, tiny_qwen3):
    from maps_train.llm.vllm_backend import VLLMBackend
    from maps_train.serve.plan import plan_server

    recipe = load_recipe(str(QWEN36_RECIPE), [f"train.student={tiny_qwen3}", f"train.output_dir={tmp_path}"])
    assert recipe.backend.language_model_only
    # The engine as the recipe builds it (a local model stands in for the 35B one: the kwargs are the point).
    assert VLLMBackend(tiny_qwen3, recipe.backend).llm_kwargs()["language_model_only"] is True
    assert "--language-model-only" in plan_server(recipe, adapters_later=True).command
    plain = load_recipe(str(REPO / "recipes" / "paper" / "qwen3-32b.yaml"))
    assert "language_model_only" not in VLLMBackend(tiny_qwen3, plain.backend).llm_kwargs()


def test_a_bad_reasoning_cap_setting_is_one_line_naming_the_field():
    for override, field in (("backend.reasoning_cap_answer_tokens=0", "reasoning_cap_answer_tokens"),
                            ("backend.reasoning_cap=maybe", "reasoning_cap")):
        with pytest.raises(MapsTrainError, match=rf"backend\.{field}: ") as error:
            load_recipe(None, [override])
        assert "\n" not in str(error.value)
    assert ReasoningCap.from_config(load_recipe(None, []).backend) == ReasoningCap("answer", 512)
