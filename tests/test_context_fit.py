"""A prompt over the context never loses its question (issue 34): what shrinks, in which order, and what the
trace, the cost and the report say about it.

Real components throughout: the tiny Qwen3's tokenizer counts every prompt, MAPS (and its no-decoupling ablation)
runs on the tiny Qwen3 through the hf backend with a small `max_model_len` (its inputs recorded as they enter
`model.generate`), and Search-o1 runs on `ContextLimitedBackend`, the scripted double behind the same fitting
code (`fit_request`) with the real tokenizer, since a random-weight model never writes a search call.
"""

from __future__ import annotations

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend

from maps_train.agents.baselines.search_o1 import BEGIN_QUERY, END_QUERY, END_RESULT, SearchO1Engine
from maps_train.agents.maps import MapsEngine, trajectory_slot
from maps_train.agents.prompt_context import LEFT_OUT, observations_slot, passages_slot
from maps_train.agents.prompting import PromptLibrary
from maps_train.agents.schedule import run_all
from maps_train.errors import MapsTrainError
from maps_train.evaluate.report import write_markdown
from maps_train.evaluate.summary import summarize
from maps_train.llm.call_spec import call_spec
from maps_train.llm.prompt_fit import fit_request
from maps_train.llm.rendering import prompt_token_ids
from maps_train.llm.router import Router
from maps_train.llm.types import ChatRequest
from maps_train.questions import Question
from maps_train.recipe import BackendConfig, RoleRoute, load_recipe
from maps_train.records.trace import RoundRecord
from maps_train.retrieval.base import Hit

MAX_TOKENS = 8
CONTEXT = 700  # the consolidator's template alone takes about 330 tiny-Qwen3 tokens; its evidence does not fit
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
LONG_PASSAGES = [
    Hit(f"p{i}", f"Tower {i}", " ".join(f"{WORDS[(i + j) % 12]}{j}" for j in range(90)) + f" engineer city{i}.", 0.0)
    for i in range(8)
]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3):
    from transformers import AutoTokenizer

    from maps_train.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(tiny_qwen3))


def hits(n: int, words: int = 5) -> list[Hit]:
    return [Hit(f"h{i}", f"T{i}", " ".join(f"w{i}x{j}" for j in range(words)), 0.0) for i in range(1, n + 1)]


# -- the order things shrink in -------------------------------------------------------------------------------


def test_the_oldest_observation_goes_first():
    slot = observations_slot(["first fact", "second fact", "third fact"])
    assert slot.steps == 3 and slot.text(0) == "o1: first fact\no2: second fact\no3: third fact"
    assert slot.text(1) == f"(observation o1 {LEFT_OUT})\no2: second fact\no3: third fact"
    assert slot.text(3) == f"(observations o1-o3 {LEFT_OUT})"


def test_the_lowest_ranked_passage_goes_first_then_the_middle_of_the_best():
    slot = passages_slot(hits(3, words=40), max_words=100, cut_steps=4)
    assert slot.steps == 2 + 4
    one_left = slot.text(1)
    assert "[1] T1:" in one_left and "[2] T2:" in one_left and "[3] T3" not in one_left
    assert one_left.endswith(f"(passage [3] {LEFT_OUT})")
    only_best = slot.text(2)
    assert "[2] T2:" not in only_best and only_best.endswith(f"(passages [2]-[3] {LEFT_OUT})")
    cut = slot.text(3).splitlines()[0]
    # The best passage keeps its opening and its end; 10 of its 40 words go from the middle.
    assert cut.startswith("[1] T1: w1x0 w1x1") and cut.endswith("w1x38 w1x39") and LEFT_OUT in cut
    assert "w1x19" not in cut and len(cut.split()) < len(only_best.splitlines()[0].split())
    assert len(slot.text(6).splitlines()[0].split()) < len(cut.split())


def test_the_oldest_round_of_the_trajectory_goes_first():
    history = [(RoundRecord(index=i, sub_queries=[f"query {i}"], observation=f"obs {i}"), hits(1)) for i in (1, 2, 3)]
    slot = trajectory_slot(history, max_words=50)
    assert slot.steps == 3 and "query 1" in slot.text(0)
    assert "query 1" not in slot.text(1) and "query 2" in slot.text(1) and f"(round 1 {LEFT_OUT})" in slot.text(1)
    assert slot.text(3) == f"(rounds 1-3 {LEFT_OUT})"


def test_a_prompt_shrinks_its_slots_in_order_and_keeps_question_and_instructions():
    template = PromptLibrary().get("maps/consolidator_coupled")
    history = [(RoundRecord(index=i, sub_queries=[f"query {i}"]), hits(2)) for i in (1, 2)]
    values = {
        "question": "Where was the engineer born?",
        "observations": observations_slot(["fact one", "fact two"]),
        "state": "state so far",
        "trajectory": trajectory_slot(history, 50),
        "evidence": passages_slot(hits(3), 50),
    }
    messages, shrinker = template.render_shrinkable(**values)
    assert messages == template.render(**values) and shrinker is not None
    assert shrinker.steps == 2 + 2 + (2 + 8)
    texts = [shrinker.messages(step)[1]["content"] for step in range(shrinker.steps + 1)]
    assert "query 1" not in texts[1] and "fact one" in texts[2]  # the trajectory's oldest round first...
    assert "fact one" not in texts[3] and "fact two" in texts[3]  # ...then the oldest observation...
    assert "[3] T3" in texts[4] and "[3] T3" not in texts[5]  # ...then the lowest-ranked passage
    for text in texts:
        assert text.startswith("Question:\nWhere was the engineer born?") and "state so far" in text
        assert text.endswith('"sufficient", true or false.')
    assert all(m["content"] == messages[0]["content"] for m in (shrinker.messages(s)[0] for s in range(11)))


# -- fitting with the real tokenizer --------------------------------------------------------------------------


def _spec(request: ChatRequest, max_tokens: int = MAX_TOKENS):
    return call_spec(request, RoleRoute(max_tokens=max_tokens))


def test_without_pieces_the_middle_of_the_longest_user_message_goes(tokenizer):
    question, instructions = "QUESTION: who built tower nine?", "INSTRUCTIONS: answer in one word."
    user = f"{question}\n" + " ".join(f"filler{i}" for i in range(400)) + f"\n{instructions}"
    request = ChatRequest(role="generator", messages=[{"role": "system", "content": "SYSTEM RULES."},
                                                      {"role": "user", "content": user}], question_id="q9")
    fitted = fit_request(tokenizer, _spec(request), 200, "shrink")
    unfitted = len(prompt_token_ids(tokenizer, _spec(request)))
    assert len(fitted.ids) <= 200 - MAX_TOKENS and fitted.dropped == unfitted - len(fitted.ids)
    seen = tokenizer.decode(fitted.ids)
    assert "SYSTEM RULES." in seen and question in seen and instructions in seen and LEFT_OUT in seen
    assert fitted.completion_fields()["fitted_messages"] == fitted.spec.request.messages
    assert fitted.completion_fields()["prompt_tokens_dropped"] == fitted.dropped > 0


def test_a_continued_turn_loses_its_oldest_paragraphs_first(tokenizer):
    paragraphs = ["<think>\nOPENING of the turn."] + [f"paragraph {i} " + "word " * 30 for i in range(12)]
    paragraphs.append("NEWEST text")
    prompt = [{"role": "user", "content": "QUESTION: who built tower nine?"}]
    request = ChatRequest(role="reasoner", messages=prompt, raw_continuation="\n\n".join(paragraphs))
    fitted = fit_request(tokenizer, _spec(request), 300, "shrink")
    turn = fitted.spec.request.raw_continuation
    assert len(fitted.ids) <= 300 - MAX_TOKENS and fitted.spec.request.messages == prompt
    assert turn.startswith("<think>\nOPENING of the turn.")
    assert turn.endswith("paragraph 11 " + "word " * 30 + "\n\nNEWEST text")
    assert "paragraph 0 " not in turn and LEFT_OUT in turn


def test_error_policy_and_a_system_prompt_that_cannot_fit_are_one_line_errors(tokenizer):
    long = ChatRequest(role="writer", messages=[{"role": "user", "content": "word " * 400}], question_id="q1")
    with pytest.raises(MapsTrainError, match="truncate_prompt=error: prompt of role 'writer' .*over max_model_len 128"):
        fit_request(tokenizer, _spec(long), 128, "error")
    huge_system = ChatRequest(role="writer", question_id="q1", messages=[
        {"role": "system", "content": "rule " * 300}, {"role": "user", "content": "QUESTION?"}])
    with pytest.raises(MapsTrainError, match="even with everything shrinkable left out") as err:
        fit_request(tokenizer, _spec(huge_system), 128, "shrink")
    assert "\n" not in str(err.value)


def test_the_openai_backend_counts_with_the_route_tokenizer_and_sends_the_fitted_prompt(tiny_qwen3):
    from maps_train.llm.openai_backend import OpenAIBackend

    backend = OpenAIBackend(BackendConfig(base_urls=["http://127.0.0.1:9/v1"], max_model_len=160))
    try:
        user = "QUESTION: who built tower nine?\n" + "filler " * 400 + "\nINSTRUCTIONS: one word."
        request = ChatRequest(role="writer", messages=[{"role": "user", "content": user}])
        spec, fitting = backend.fit(call_spec(request, RoleRoute(backend="openai", model=tiny_qwen3, max_tokens=8)))
        sent = backend.body(spec)["messages"][0]["content"]
        assert sent.startswith("QUESTION: who built tower nine?") and sent.endswith("INSTRUCTIONS: one word.")
        assert fitting["prompt_tokens_dropped"] > 0 and fitting["fitted_messages"] == backend.body(spec)["messages"]
        assert len(prompt_token_ids(backend.tokenizer(tiny_qwen3, "writer"), spec)) <= 160 - 8
    finally:
        backend.close()


# -- MAPS on the tiny Qwen3 (hf backend) ------------------------------------------------------------------------


def _maps_recipe(tiny_qwen3, *overrides):
    return load_recipe(None, [
        "agent.max_rounds=2", "agent.num_directions=2", "agent.top_k=4", "agent.max_passage_words=100",
        "roles.default.backend=hf", f"roles.default.model={tiny_qwen3}", f"roles.default.max_tokens={MAX_TOKENS}",
        *overrides,
    ])


QUESTION = Question(id="q0", question="Where was the engineer of tower 0 born?", dataset="toy")


@pytest.fixture(scope="module")
def maps_runs(hf_tiny_qwen3, tiny_qwen3):
    """MAPS and its no-decoupling ablation on the tiny Qwen3 with a 700-token context; every prompt as it
    entered `model.generate` (decoded, padding dropped)."""
    backend = hf_tiny_qwen3
    seen: list[str] = []
    generate, saved_len, saved_config = backend.model.generate, backend.max_model_len, backend.config

    def recording_generate(input_ids, attention_mask, **kwargs):
        for row, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            seen.append(backend.tokenizer.decode([t for t, m in zip(row, mask) if m]))
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    backend.model.generate, backend.max_model_len = recording_generate, CONTEXT
    backend.config = BackendConfig(dtype="float32", max_model_len=CONTEXT)
    runs = {}
    try:
        for decoupled in (True, False):
            recipe = _maps_recipe(tiny_qwen3, f"agent.decoupled={str(decoupled).lower()}")
            engine = MapsEngine(recipe, Router(recipe, backends={"hf": backend}), RecordingRetriever(LONG_PASSAGES))
            start = len(seen)
            (trace,) = run_all(engine, [QUESTION], "step")
            runs[decoupled] = (engine, trace, seen[start:])
    finally:
        del backend.model.generate  # the instance attribute: the model's own method again
        backend.max_model_len, backend.config = saved_len, saved_config
    return runs


@pytest.mark.parametrize("decoupled", [True, False], ids=["maps", "no-decoupling"])
def test_maps_over_the_context_answers_and_every_prompt_keeps_question_and_system(maps_runs, decoupled, tokenizer):
    engine, trace, seen = maps_runs[decoupled]
    calls = [call for round_ in trace.rounds for call in round_.calls] + [trace.final_call]
    assert trace.stop_reason == "max_rounds" and trace.final_call is not None and len(seen) == len(calls)
    for prompt in seen:
        assert QUESTION.question in prompt
        assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= CONTEXT - MAX_TOKENS
    for call in calls:
        # The trace holds what the model saw: its messages render to exactly the tokens counted for the call.
        spec = _spec(ChatRequest(role=call.role, messages=call.messages))
        rendered = tokenizer.decode(prompt_token_ids(tokenizer, spec))
        assert rendered in seen and len(prompt_token_ids(tokenizer, spec)) == call.usage.prompt_tokens
        template = engine.prompts.get(engine._prompt(_prompt_file(call)))
        assert call.messages[0] == {"role": "system", "content": template.system}
        assert call.messages[1]["content"].endswith(template.user[-40:])  # the instructions, whole
        assert (call.usage.prompt_tokens_dropped > 0) == (LEFT_OUT in call.messages[1]["content"])
    shrunk = [call for call in calls if call.usage.prompt_tokens_dropped]
    assert shrunk and len(shrunk) < len(calls)  # the consolidator's long evidence shrank; the first writers did not
    assert trace.cost.truncated_calls == len(shrunk)
    assert trace.cost.prompt_tokens_dropped == sum(call.usage.prompt_tokens_dropped for call in shrunk)
    if not decoupled:  # the ablation's trajectory (every passage of round 1) is the first to go
        assert any(f"(round 1 {LEFT_OUT})" in call.messages[1]["content"] for call in shrunk)


def _prompt_file(call) -> str:
    return {"answer": "answer_short"}.get(call.role, call.role)


def test_the_report_counts_truncated_calls_per_system(maps_runs, tmp_path):
    rows = [
        {"system": name, "dataset": "toy", "cost": trace.cost.to_dict(), "stop_reason": trace.stop_reason}
        for name, (_, trace, _) in (("maps", maps_runs[True]), ("coupled", maps_runs[False]))
    ]
    summary = summarize(rows)
    write_markdown(summary, tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert "## Prompts shrunk to fit the context" in report
    for row in rows:
        calls = row["cost"]["truncated_calls"]
        assert calls > 0 and summary["cells"][row["system"]]["Avg"]["truncation"]["calls"] == calls
        assert f"| {row['system']} | {calls} | 1 | " in report


def test_truncate_prompt_error_still_refuses(hf_tiny_qwen3, tiny_qwen3):
    recipe = _maps_recipe(tiny_qwen3, "agent.max_rounds=1")
    saved_len, saved_config = hf_tiny_qwen3.max_model_len, hf_tiny_qwen3.config
    hf_tiny_qwen3.max_model_len = CONTEXT
    hf_tiny_qwen3.config = BackendConfig(dtype="float32", max_model_len=CONTEXT, truncate_prompt="error")
    try:
        engine = MapsEngine(recipe, Router(recipe, backends={"hf": hf_tiny_qwen3}), RecordingRetriever(LONG_PASSAGES))
        with pytest.raises(MapsTrainError, match="truncate_prompt=error: prompt of role 'consolidator'") as err:
            run_all(engine, [QUESTION], "step")
        assert "\n" not in str(err.value)
    finally:
        hf_tiny_qwen3.max_model_len, hf_tiny_qwen3.config = saved_len, saved_config


# -- Search-o1: a turn that outgrows the context ------------------------------------------------------------------


class ContextLimitedBackend(ScriptedBackend):
    """`ScriptedBackend` behind a context limit: each request is rendered with the real tokenizer and fitted by
    `fit_request` (as the hf and vllm backends do) before its script answers; `seen` holds every fitted prompt,
    `unfitted` each request's token count before fitting and `rooms` the tokens its prompt could take."""

    def __init__(self, tokenizer, recipe, max_model_len: int, scripts):
        super().__init__(scripts)
        self.tokenizer, self.recipe, self.max_model_len = tokenizer, recipe, max_model_len
        self.seen: list[str] = []
        self.unfitted: list[int] = []
        self.rooms: list[int] = []

    def generate(self, requests, routes=None):
        specs = [call_spec(r, self.recipe.route(r.role)) for r in requests]
        fitted = [fit_request(self.tokenizer, s, self.max_model_len, "shrink") for s in specs]
        self.unfitted += [len(prompt_token_ids(self.tokenizer, s)) for s in specs]
        self.rooms += [self.max_model_len - s.max_tokens for s in specs]
        self.seen += [self.tokenizer.decode(f.ids) for f in fitted]
        completions = super().generate([f.spec.request for f in fitted])
        for completion, fit in zip(completions, fitted):
            completion.prompt_tokens = len(fit.ids)
            for name, value in fit.completion_fields().items():
                setattr(completion, name, value)
        return completions


def long_reasoner(request, turn):
    if turn < 5:
        thoughts = "\n\n".join(f"Thought {turn}.{k}: " + "the tower engineer lived somewhere " * 6 for k in range(3))
        return f"{thoughts}\n\n{BEGIN_QUERY}tower query {turn}"
    return "So the engineer was born in Dijon. \\boxed{Dijon}"


def condenser(request, turn):
    return f"**Final Information**\n\nFinding {turn}: the engineer was born in Dijon."


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_search_o1_turn_outgrowing_the_context_keeps_the_question(tokenizer, thinking):
    recipe = load_recipe(None, ["agent.top_k=2", "agent.max_turns=8", f"roles.default.max_tokens={MAX_TOKENS}",
                                f"roles.reasoner.enable_thinking={str(thinking).lower()}"])
    backend = ContextLimitedBackend(tokenizer, recipe, 1000, {"reasoner": long_reasoner, "condenser": condenser})
    engine = SearchO1Engine(recipe, backend, RecordingRetriever())
    question = Question(id="q0", question="Where was the engineer of the Eiffel Tower born?", dataset="toy")
    (trace,) = run_all(engine, [question], "step")
    assert trace.stop_reason == "answered" and trace.final_answer == "Dijon"
    reasoner_prompt = engine.prompts.render("baselines/search_o1_reasoner", max_searches=recipe.agent.max_searches,
                                            question=question.question,
                                            answer_format=engine.answer_format("boxed", None))
    for prompt, room in zip(backend.seen, backend.rooms, strict=True):
        assert question.question in prompt and len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= room
    reasoner_calls = [round_.calls[0] for round_ in trace.rounds]
    reasoner_seen = [p for p, r in zip(backend.seen, backend.requests()) if r.role == "reasoner"]
    for index, (call, prompt) in enumerate(zip(reasoner_calls, reasoner_seen)):
        assert all(m["content"] in prompt for m in reasoner_prompt)  # system prompt, question, instructions whole
        assert call.messages[: len(reasoner_prompt)] == reasoner_prompt
        turn = call.messages[-1]["content"] if len(call.messages) > len(reasoner_prompt) else ""
        assert (call.usage.prompt_tokens_dropped > 0) == (LEFT_OUT in turn)
        if call.usage.prompt_tokens_dropped:  # the newest evidence stays: the last query and its findings (issue 46)
            assert f"{BEGIN_QUERY}tower query {index - 1}{END_QUERY}" in turn
            assert turn.rstrip().endswith(f"Finding {index - 1}: the engineer was born in Dijon.{END_RESULT}")
    dropped = [c.usage.prompt_tokens_dropped for c in reasoner_calls]
    assert dropped[0] == 0 and dropped[-1] > 0
    all_calls = [c for round_ in trace.rounds for c in round_.calls]
    for before, room, call in zip(backend.unfitted, backend.rooms, all_calls, strict=True):
        assert (call.usage.prompt_tokens_dropped > 0) == (before > room)
        assert call.usage.prompt_tokens + call.usage.prompt_tokens_dropped == before
    shrunk = [c for c in all_calls if c.usage.prompt_tokens_dropped]
    assert trace.cost.truncated_calls == len(shrunk) > sum(1 for d in dropped if d)  # a condenser's shrank too
    assert trace.cost.prompt_tokens_dropped == sum(c.usage.prompt_tokens_dropped for c in shrunk)
