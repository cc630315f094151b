"""Every method through Qwen3's real chat templates (tests/fixtures/chat_templates/, see SOURCE.md): Qwen3 with
thinking on and off, Qwen3.6 with thinking on and off.

`TemplateModel` stands in for a Qwen3 model behind the project's own prompt code: each request is rendered by
`llm.rendering.render_prompt` with the template under test (an error fails the run), a script writes what the model
would generate after that prompt, and the reply is cut at the stop string and split into reasoning and answer as
the real backends do (`first_stop`, `split_thinking` with `generation_opens_thinking`). A call cut at a stop string
inside its reasoning is continued by the router (`llm.budget`): the double then writes the rest of the same
generation (or, when nothing was left after the stop string, the script's next step). The scripts write
Qwen3-shaped text: reasoning blocks in several turns (`<think>\\n...\\n</think>\\n\\n`, Qwen3's layout: the
backends strip other whitespace around reasoning), tool tags inside and outside them. The end-to-end runs at the
bottom use the real tiny Qwen3 through the hf backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from scripted_backend import (
    RecordingRetriever,
    consolidator_sufficient_after,
    default_answer,
    default_proposer,
    default_writer,
)

from maps_train.agents.baselines.base import model_piece
from maps_train.agents.baselines.parallel_search import INVALID_ACTION, ParallelSearchEngine
from maps_train.agents.baselines.s3 import S3Engine
from maps_train.agents.baselines.search_o1 import BEGIN_QUERY, END_QUERY
from maps_train.agents.registry import engine_class
from maps_train.agents.schedule import run_all
from maps_train.llm.call_spec import call_spec, first_stop
from maps_train.llm.prompt_fit import FittedPrompt, fit_request
from maps_train.llm.rendering import render_prompt
from maps_train.llm.router import Router
from maps_train.llm.thinking import ends_inside_thinking, generation_opens_thinking, split_thinking
from maps_train.llm.types import ChatRequest, Completion
from maps_train.questions import Question
from maps_train.recipe import RoleRoute, load_recipe
from maps_train.records.trace import RoleCall

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
CASES = {  # name -> (template file, enable_thinking on every route)
    "qwen3-thinking": ("qwen3.jinja", True),
    "qwen3-no-thinking": ("qwen3.jinja", False),
    "qwen3.6-thinking": ("qwen3_6.jinja", True),
    "qwen3.6-no-thinking": ("qwen3_6.jinja", False),
}
QUESTION = "Where was the engineer of the Eiffel Tower born?"
THINK = "<think>\n"


@pytest.fixture(scope="module")
def tokenizers(tiny_qwen3):
    """The tiny Qwen3 tokenizer once per template file, its chat template swapped for the fixture."""
    from transformers import AutoTokenizer

    loaded = {}
    for name in {file for file, _ in CASES.values()}:
        tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
        tokenizer.chat_template = (TEMPLATES / name).read_text()
        loaded[name] = tokenizer
    return loaded


# -- the model double ----------------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One call as the model saw it: the request, its rendered prompt, and all the model generated after it (the
    stop string included: the backend drops it, the engine puts it back)."""

    request: ChatRequest
    prompt: str
    generated: str


class TemplateModel:
    """Backend double: renders each request with the real template, answers from a per-role script.

    A script gets (request, turn) and returns the text a Qwen3 model writes after the prompt, or (text,
    finish_reason). Where the prompt already opened the think block (Qwen3.6's generation prompt), the model
    writes from inside it, so a leading `<think>\\n` of the script is not generated."""

    def __init__(self, tokenizer, routes: dict[str, RoleRoute], scripts, max_model_len: int | None = None):
        """`max_model_len`: fit each prompt into this context as the real backends do (`fit_request`)."""
        self.tokenizer, self.routes, self.scripts = tokenizer, routes, scripts
        self.max_model_len = max_model_len
        self.fitted: list[FittedPrompt] = []
        self.sent: list[Sent] = []
        self._turns: dict[tuple[str, str | None], int] = {}
        self._rest: dict[tuple[str, str | None], str] = {}  # what a generation stopped inside its reasoning had left

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        routes = routes or [self.routes.get(r.role, self.routes["default"]) for r in requests]
        return [self._one(request, route) for request, route in zip(requests, routes)]

    def _one(self, request: ChatRequest, route: RoleRoute) -> Completion:
        spec = call_spec(request, route)
        fitting: dict = {}
        if self.max_model_len is None:
            prompt = render_prompt(self.tokenizer, spec)
        else:
            fitted = fit_request(self.tokenizer, spec, self.max_model_len, "shrink")
            self.fitted.append(fitted)
            prompt, fitting = fitted.text, fitted.completion_fields()
        key = (request.role, request.question_id)
        opened = generation_opens_thinking(prompt, spec)
        if key in self._rest:
            generated, finish = self._rest.pop(key), "stop"
        else:
            turn = self._turns.get(key, 0)
            self._turns[key] = turn + 1
            written = self.scripts[request.role](request, turn)
            generated, finish = written if isinstance(written, tuple) else (written, "stop")
            if opened:  # the template opened the block: the model writes no opening tag of its own
                generated = generated.removeprefix(THINK).removeprefix("<think>")
        text, stop = first_stop(generated, request.stop)
        answer, reasoning = split_thinking(text, opened)
        rest = generated[len(text) + len(stop or "") :]
        if stop is not None and rest and ends_inside_thinking(text, reasoning):
            self._rest[key] = rest  # continued past the stop string, the model writes on
        self.sent.append(Sent(request, prompt, text + (stop or "")))
        return Completion(text=answer, reasoning=reasoning, generated=text, completion_tokens=len(text.split()),
                          model="template-double", finish_reason=finish if stop is None else "stop",
                          stop_string=stop, role=request.role, **fitting)

    def calls(self, role: str, question_id: str = "q0") -> list[Sent]:
        return [s for s in self.sent if s.request.role == role and s.request.question_id == question_id]


def thinking_first(payload):
    """A one-shot role's reply: a reasoning block, then the payload the role's parser reads."""

    def script(request: ChatRequest, turn: int) -> str:
        return f"{THINK}Reasoning about the {request.role}'s reply {turn}.\n</think>\n\n{payload(request, turn)}"

    return script


def steps(*texts):
    """A continuing role's generations, one per step (the last repeats)."""
    return lambda request, turn: texts[min(turn, len(texts) - 1)]


# Each continuing role's steps write a tag inside their reasoning once (not an action: the router continues the
# generation past its stop string), reasoning blocks in several turns, and actions after the reasoning.
PARALLEL_SEARCH_STEPS = steps(
    f"{THINK}I need two facts about the tower.\n</think>\n\n"
    "<search>Eiffel Tower engineer ## Gustave Eiffel born</search>",
    f"{THINK}The engineer is Gustave Eiffel, so <search>Gustave Eiffel Dijon</search>",  # a tag inside reasoning
    # still inside that block: it closes, then a second reasoning block in the same generation
    "He was born in Dijon.\n</think>\n\n<think>\nOne more check.\n</think>\n\n<search>Dijon Burgundy</search>",
    f"{THINK}Confirm the region.\n</think>\n\n<search>Burgundy region</search>",
    f"{THINK}Dijon is in Burgundy; the answer is Dijon.\n</think>\n\n<answer>Dijon</answer>",
)
S3_STEPS = steps(
    f"{THINK}The first documents name the tower.\n</think>\n\n<important_info>[1]</important_info>\n"
    '<search_complete>False</search_complete>\n<query>{"query": "Gustave Eiffel birthplace"}</query>',
    f'{THINK}Doc 2 says it. <important_info>[2]</important_info> Still, <query>{{"query": "Dijon"}}</query>',
    'Dijon is in Burgundy.\n</think>\n\n<query>{"query": "Burgundy region"}</query>',
    f'{THINK}One more.\n</think>\n\n<important_info>[1, 2]</important_info><query>{{"query": "Dijon city"}}</query>',
    f"{THINK}Enough now.\n</think>\n\n<search_complete>True</search_complete>",
)
SEARCH_O1_STEPS = steps(
    f"{THINK}I need the engineer first.\n{BEGIN_QUERY}Eiffel Tower engineer{END_QUERY}",  # a marker inside reasoning
    f"So I search after thinking.\n</think>\n\n{BEGIN_QUERY}Eiffel Tower engineer{END_QUERY}",
    f"So it is Gustave Eiffel.\n<think>\nNow his birthplace.\n</think>\n\n{BEGIN_QUERY}Gustave Eiffel birthplace{END_QUERY}",
    f"{THINK}He was born in Dijon.\n</think>\n\nThe answer is \\boxed{{Dijon}}.",
)
DIJON = thinking_first(lambda request, turn: "Dijon")
MAPS_SCRIPTS = {
    "proposer": thinking_first(default_proposer),
    "writer": thinking_first(default_writer),
    "consolidator": thinking_first(consolidator_sufficient_after(2)),
    "answer": thinking_first(default_answer),
}
METHODS = {  # name -> (recipe overrides, scripts, the continuing role or None)
    "maps": (["agent.method=maps"], MAPS_SCRIPTS, None),
    "maps-no-directions": (  # no proposer: the writer writes the sub-queries directly
        ["agent.method=maps", "agent.use_directions=false"],
        {role: script for role, script in MAPS_SCRIPTS.items() if role != "proposer"},
        None,
    ),
    "maps-no-parallelism": (["agent.method=maps", "agent.num_directions=1"], MAPS_SCRIPTS, None),
    "maps-no-decoupling": (["agent.method=maps", "agent.decoupled=false"], MAPS_SCRIPTS, None),
    "vanilla": (["agent.method=vanilla"], {"generator": DIJON}, None),
    "search_o1": (
        ["agent.method=search_o1"],
        {
            "reasoner": SEARCH_O1_STEPS,
            "condenser": thinking_first(lambda r, t: "**Final Information**\n\nGustave Eiffel was born in Dijon."),
        },
        "reasoner",
    ),
    "parallel_search": (["agent.method=parallel_search"], {"reasoner": PARALLEL_SEARCH_STEPS}, "reasoner"),
    "s3": (["agent.method=s3"], {"searcher": S3_STEPS, "generator": DIJON}, "searcher"),
}
CONTINUING = [name for name, (_, _, role) in METHODS.items() if role]


def run_through_template(tokenizers, case: str, overrides, scripts, questions=None, *, max_tokens=64,
                         max_model_len=None, retriever=None, reasoning_cap=None):
    """One method over the template of `case`, through the real router; returns (traces, model double).
    `max_model_len`: the double fits every prompt into that context (see `TemplateModel`)."""
    template, thinking = CASES[case]
    recipe = load_recipe(None, ["agent.top_k=2", "agent.max_rounds=3", *overrides])
    routes = {"default": RoleRoute(backend="hf", model="qwen3-template", enable_thinking=thinking,
                                   max_tokens=max_tokens)}
    recipe.roles = routes
    model = TemplateModel(tokenizers[template], routes, scripts, max_model_len)
    router = Router(routes, backends={"hf": model}, reasoning_cap=reasoning_cap)
    engine = engine_class(recipe.agent.method)(recipe, router, retriever or RecordingRetriever())
    traces = run_all(engine, questions or [Question(id="q0", question=QUESTION, dataset="toy")], "step")
    return traces, model


# -- every method, every template ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_renders_every_role_through_the_real_template(tokenizers, method, case):
    overrides, scripts, _ = METHODS[method]
    (trace,), model = run_through_template(tokenizers, case, overrides, scripts)
    assert trace.stop_reason and trace.final_answer in ("Dijon", "answer of q0")
    assert {s.request.role for s in model.sent} == set(scripts)  # every role of the method was called
    for sent in model.sent:
        assert QUESTION in sent.prompt, f"{sent.request.role}: the question is not in the prompt"
        assert sent.prompt.count("<|im_start|>assistant") == 1  # one turn: the model's own, never a chat history


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", CONTINUING)
def test_a_continued_turn_holds_everything_the_model_wrote_byte_for_byte(tokenizers, method, case):
    overrides, scripts, role = METHODS[method]
    (trace,), model = run_through_template(tokenizers, case, overrides, scripts)
    calls = model.calls(role)
    turn_rounds = trace.rounds[1:] if method == "s3" else trace.rounds  # S3's round 1 is its initial retrieval
    reasoner_calls = [c for r in turn_rounds for c in r.calls if c.role == role]
    # One call per step, and one more for each stop string that fired inside the reasoning (written past).
    assert len(turn_rounds) >= 3 and len(calls) == len(turn_rounds) + 1
    assert sum(c.usage.stops_in_reasoning for c in reasoner_calls) == 1
    assert trace.cost.by_role[role].stops_in_reasoning == 1
    spliced_texts = []
    for before, after in zip(calls, calls[1:]):
        # The next prompt is this prompt, then exactly what the model generated (its stop tag put back), then only
        # the spliced tool result (nothing when the generation went on past a stop string inside its reasoning).
        kept = before.prompt + before.generated
        assert after.prompt.startswith(kept), f"{method}/{case}: the turn was not read back byte for byte"
        spliced_texts.append(after.prompt[len(kept) :])
    observations = [r.observation for r in turn_rounds if r.observation]
    assert [t for t in spliced_texts if t] and all(o in "".join(spliced_texts) for o in observations)
    assert spliced_texts.count("") == 1
    assert all(c.reasoning for c in reasoner_calls)  # a reasoning block in every step
    assert trace.final_answer == "Dijon"
    if method == "parallel_search":
        assert [r.extra["action"] for r in trace.rounds] == ["search", "search", "search", "answer"]
        assert [r.sub_queries for r in trace.rounds[:3]] == [
            ["Eiffel Tower engineer", "Gustave Eiffel born"], ["Dijon Burgundy"], ["Burgundy region"]]
    if method == "s3":
        assert [r.extra["action"] for r in turn_rounds] == ["search", "search", "search", "complete"]
        assert "kept" not in trace.rounds[2].extra  # `<important_info>` inside the reasoning does not count
        assert trace.rounds[3].extra["kept"]
    if method == "search_o1":
        assert [r.sub_queries for r in trace.rounds] == [["Eiffel Tower engineer"], ["Gustave Eiffel birthplace"], []]


# Generations whose spacing is not Qwen3's own layout (no newline after `<think>`, none before `</think>`, spaces
# before the action, a trailing blank): the split parts would be put back re-spaced; the turn must hold these bytes.
UNEVEN_STEPS = {
    "parallel_search": steps(
        "<think>I need the engineer.</think>  <search>Eiffel Tower engineer</search>",
        "<think> So Eiffel;   now where was he born? </think>\n<search>Gustave Eiffel birthplace</search>",
        "<think>Dijon.</think> <answer>Dijon</answer>",
    ),
    "s3": steps(
        '<think>Docs name the tower.</think> <search_complete>False</search_complete> <query>{"query": "Eiffel"}</query>',
        '<think>  Doc 2 says Dijon. </think><important_info>[2]</important_info><query>{"query": "Dijon"}</query>',
        '<think>Enough.</think>   <search_complete>True</search_complete>',
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", sorted(UNEVEN_STEPS))
def test_a_turn_keeps_the_models_own_spacing_byte_for_byte(tokenizers, method, case):
    """What the backend generated goes back into the turn as generated (`Completion.generated`), not rebuilt from
    the split reasoning and answer, which would normalise the whitespace around `<think>` and `</think>`."""
    overrides, scripts, role = METHODS[method]
    (trace,), model = run_through_template(tokenizers, case, overrides, {**scripts, role: UNEVEN_STEPS[method]})
    calls = model.calls(role)
    assert len(calls) >= 3
    for before, after in zip(calls, calls[1:]):
        assert after.prompt.startswith(before.prompt + before.generated), f"{method}/{case}: re-spaced turn"
    assert trace.final_answer == "Dijon"


def test_a_piece_inside_an_open_think_block_continues_it():
    call = RoleCall(role="reasoner", messages=[], raw_text="<answer>Dijon", parsed={}, parse_ok=True,
                    reasoning="He was born in Dijon.")
    assert model_piece(call, inside=True) == "He was born in Dijon.\n</think>\n\n<answer>Dijon"
    assert model_piece(call) == f"{THINK}He was born in Dijon.\n</think>\n\n<answer>Dijon"


# -- ParallelSearch: an answer cut off by the token limit -------------------------------------------------------------


def test_parallel_search_does_not_take_an_answer_cut_off_by_the_token_limit(tokenizers):
    cut = (f"{THINK}I know it.\n</think>\n\n<answer>Dij", "length")
    overrides = ["agent.method=parallel_search", "agent.max_searches=1"]
    (trace,), model = run_through_template(tokenizers, "qwen3-no-thinking", overrides, {"reasoner": steps(cut)})
    # As Search-o1 and S3 do: no clean answer; the cut-off is a parse failure and no action.
    assert [r.extra["action"] for r in trace.rounds] == ["truncated", "truncated"]
    assert trace.stop_reason == "no_answer" and trace.final_answer == ""
    assert trace.parse_failures == {"reasoner": 2}
    assert trace.rounds[0].calls[0].parse_error == "action cut off by the token limit"
    # The turn reads back what the model wrote (the tag left open), then the invalid-action note.
    first, second = model.calls("reasoner")
    assert second.prompt == first.prompt + first.generated + INVALID_ACTION


# -- the real tiny Qwen3 through the hf backend ------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("engine_cls", [ParallelSearchEngine, S3Engine], ids=["parallel_search", "s3"])
def test_parallel_search_and_s3_continue_their_turn_on_the_real_tiny_qwen3(hf_tiny_qwen3, engine_cls, thinking):
    recipe = load_recipe(None, ["agent.top_k=2", "agent.max_searches=2"])
    route = RoleRoute(backend="hf", model=hf_tiny_qwen3.model_name, max_tokens=8, enable_thinking=thinking)
    recipe.roles = {"default": route}
    router = Router(recipe.roles, backends={"hf": hf_tiny_qwen3})
    sent: list[ChatRequest] = []

    class Recording:  # what reached the hf backend, after the engine's raw-turn wrapper
        def generate(self, requests):
            sent.extend(requests)
            return router.generate(requests)

    engine = engine_cls(recipe, Recording(), RecordingRetriever())
    (trace,) = engine.run_batch([Question(id="q0", question=QUESTION, dataset="toy")])
    role = "reasoner" if engine_cls is ParallelSearchEngine else "searcher"
    turn_calls = [c for r in trace.rounds for c in r.calls if c.role == role]
    assert len(turn_calls) >= 3 and trace.stop_reason  # random weights write junk: the step limit ends it
    continued = [r for r in sent if r.role == role and r.raw_continuation is not None]
    assert len(continued) == len(turn_calls) - 1
    for request, call in zip(continued, turn_calls[1:]):
        prompt = render_prompt(hf_tiny_qwen3.tokenizer, call_spec(request, route))
        assert prompt.endswith(request.raw_continuation) and QUESTION in prompt
        assert call.messages[-1] == {"role": "assistant", "content": request.raw_continuation}  # the trace's view
        assert 0 < call.usage.completion_tokens <= 8 and call.usage.prompt_tokens > 50
