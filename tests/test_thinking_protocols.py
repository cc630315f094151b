"""A thinking model against the tool-using baselines' protocols (issue 46): Qwen3 restates a protocol's own
instructions inside its reasoning ("call a search engine by <search> your query </search>", "between <answer> and
</answer>"), and a tag inside `<think>` is not an action.

Through the real Qwen3 and Qwen3.6 templates (`TemplateModel` of tests/test_qwen3_templates.py: each request
rendered by the project's prompt code, the scripted generation cut at its stop string as a backend cuts it): a stop
string inside the reasoning is written past (`llm.budget.continue_past_stops`), actions are read outside the
reasoning, and every such stop is counted on the call, the question's cost and the report.
"""

from __future__ import annotations

import pytest
import test_qwen3_templates
from test_qwen3_templates import THINK, run_through_template, steps

from maps_train.agents.baselines.parallel_search import INVALID_ACTION, PROMPT
from maps_train.agents.baselines.s3 import NUDGE, SEARCHER_PROMPT, query_text
from maps_train.agents.baselines.search_o1 import BEGIN_QUERY, END_QUERY, REASONER_PROMPT
from maps_train.agents.jsonparse import has_content, tag_contents
from maps_train.agents.prompting import PromptLibrary
from maps_train.evaluate.report import write_markdown
from maps_train.evaluate.summary import summarize
from maps_train.llm.budget import ReasoningCap
from maps_train.llm.router import Router
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import RoleRoute

tokenizers = test_qwen3_templates.tokenizers  # the fixture: the tiny Qwen3 tokenizer with each real template
THINKING = ["qwen3-thinking", "qwen3.6-thinking"]

# The originals' own instruction and correction texts, restated inside the reasoning.
PARALLEL_SEARCH_ECHO = steps(
    f"{THINK}The instructions say I can call a search engine by <search> your query </search>. The note said to "
    "put the query between <search> and </search>, and the answer between <answer> and </answer>. "
    "So I look up the engineer first.\n</think>\n\n<search>Eiffel Tower engineer</search>",
    f"{THINK}Gustave Eiffel, born in Dijon. Answer format: <answer> and </answer>.\n</think>\n\n<answer>Dijon</answer>",
)
S3_ECHO = steps(
    f"{THINK}If the documents were enough I would write <search_complete>True</search_complete>. They are not; "
    'the format is <query>{"query": "[a search query]"}</query>.\n</think>\n\n'
    '<search_complete>False</search_complete>\n<query>{"query": "Gustave Eiffel birthplace"}</query>',
    f"{THINK}Doc 1 says Dijon.\n</think>\n\n<important_info>[1]</important_info>\n"
    "<search_complete>True</search_complete>",
)
SEARCH_O1_ECHO = steps(
    f"{THINK}To search I write {BEGIN_QUERY} your search query {END_QUERY} and wait for the findings. "
    f"I need the engineer.\n</think>\n\n{BEGIN_QUERY}Eiffel Tower engineer{END_QUERY}",
    f"{THINK}Gustave Eiffel was born in Dijon.\n</think>\n\nThe answer is \\boxed{{Dijon}}.",
)
ECHO_CASES = {  # method -> (recipe overrides, scripts, continuing role, expected searches, stops inside reasoning)
    "parallel_search": (
        ["agent.method=parallel_search"],
        {"reasoner": PARALLEL_SEARCH_ECHO},
        "reasoner",
        [["Eiffel Tower engineer"]],
        4,
    ),
    "s3": (
        ["agent.method=s3"],
        {"searcher": S3_ECHO, "generator": lambda request, turn: f"{THINK}Doc 1.\n</think>\n\nDijon"},
        "searcher",
        [["Gustave Eiffel birthplace"]],
        1,
    ),
    "search_o1": (
        ["agent.method=search_o1"],
        {"reasoner": SEARCH_O1_ECHO,
         "condenser": lambda request, turn: "**Final Information**\n\nGustave Eiffel was born in Dijon."},
        "reasoner",
        [["Eiffel Tower engineer"]],
        1,
    ),
}


@pytest.mark.parametrize("case", THINKING)
@pytest.mark.parametrize("method", sorted(ECHO_CASES))
def test_tags_restated_inside_the_reasoning_are_no_actions(tokenizers, method, case):
    overrides, scripts, role, searches, stops = ECHO_CASES[method]
    (trace,), model = run_through_template(tokenizers, case, overrides, scripts)
    searched = [r.sub_queries for r in trace.rounds if r.sub_queries and r.extra.get("action") != "initial_search"]
    assert searched == searches  # never "your query", "and", "[a search query]" or "your search query"
    assert trace.final_answer == "Dijon" and trace.stop_reason in ("answered", "search_complete")
    if method == "s3":  # the restated completion flag did not end the search: it searched, then completed
        assert [r.extra["action"] for r in trace.rounds[1:]] == ["search", "complete"]
    # Each stop string that fired inside the reasoning was written past: one more call of the role, counted.
    assert len(model.calls(role)) == len([c for r in trace.rounds for c in r.calls if c.role == role]) + stops
    assert trace.cost.by_role[role].stops_in_reasoning == stops
    assert sum(c.usage.stops_in_reasoning for r in trace.rounds for c in r.calls) == stops


def test_the_report_counts_stops_inside_reasoning_per_system(tokenizers, tmp_path):
    rows = []
    for method, (overrides, scripts, _, _, _) in ECHO_CASES.items():
        (trace,), _ = run_through_template(tokenizers, "qwen3-thinking", overrides, scripts)
        rows.append({"system": method, "dataset": "toy", "question_id": "q0", "cost": trace.cost.to_dict(),
                     "compute_flops": None})
    write_markdown(summarize(rows), tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert "| Stops inside reasoning |" in report
    assert "| parallel_search | all | 0 | 0 | 4 |" in report
    assert "| s3 | all | 0 | 0 | 1 |" in report and "| search_o1 | all | 0 | 0 | 1 |" in report


# -- instruction texts that invite no echo ----------------------------------------------------------------------------

PAIRS = {  # the tags each protocol reads actions from
    "parallel_search": [("<search>", "</search>"), ("<answer>", "</answer>")],
    "s3": [("<query>", "</query>"), ("<search_complete>", "</search_complete>")],
    "search_o1": [(BEGIN_QUERY, END_QUERY)],
}
EXAMPLES = {" Marie Curie ", " C ", "Tern scooter manufacturer", "Ingrid Halvorsen birthplace"}  # shown as examples


def _instruction_texts(method: str) -> str:
    library = PromptLibrary()
    names = {
        "parallel_search": [PROMPT, "baselines/answer_tag_short", "baselines/answer_tag_choice"],
        "s3": [SEARCHER_PROMPT],
        "search_o1": [REASONER_PROMPT, "baselines/answer_boxed_short", "baselines/answer_boxed_choice"],
    }[method]
    texts = [library.get(name).user for name in names]
    texts += {"parallel_search": [INVALID_ACTION], "s3": [NUDGE], "search_o1": []}[method]
    return "\n".join(texts)


@pytest.mark.parametrize("method", sorted(PAIRS))
def test_no_instruction_or_correction_text_holds_an_action_with_words_in_it(method):
    """Restated word for word after the reasoning, no instruction or correction text searches, answers or ends
    the search: every tag pair in them holds an ellipsis (no letter or digit) or a declared example."""
    text = _instruction_texts(method)
    for opener, closer in PAIRS[method]:
        for content in tag_contents(text, opener, closer):
            if content in EXAMPLES:
                continue
            if opener == "<query>":
                assert query_text(content) is None, content
            elif opener == "<search_complete>":
                assert content.strip().lower() != "true", content
            else:
                assert not has_content(content), f"{opener}{content}{closer}"
    assert "\\boxed{" not in text or "\\boxed{…}" in text


# -- the budget of a call written past its stops ------------------------------------------------------------------


class StopsInsideReasoning:
    """A backend double: every generation restates the search tag inside its reasoning (10 tokens each)."""

    def __init__(self):
        self.requests: list[ChatRequest] = []

    def generate(self, requests, routes=None):
        self.requests.extend(requests)
        out = []
        for request in requests:
            if request.max_tokens == 7:  # the reasoning cap's follow-up
                out.append(Completion(text="Dijon", generated="Dijon", completion_tokens=2, finish_reason="stop"))
                continue
            generated = "<think>\nI should write <search> your query" if request.raw_continuation is None else " more"
            out.append(Completion(text="", reasoning=generated.strip(), generated=generated, completion_tokens=10,
                                  finish_reason="stop", stop_string="</search>"))
        return out


def test_writing_past_stops_keeps_to_max_tokens_then_the_reasoning_cap_answers():
    backend = StopsInsideReasoning()
    routes = {"default": RoleRoute(backend="hf", enable_thinking=True, max_tokens=30)}
    router = Router(routes, backends={"hf": backend}, reasoning_cap=ReasoningCap(answer_tokens=7))
    request = ChatRequest(role="reasoner", messages=[{"role": "user", "content": "Q"}], stop=["</search>", "</answer>"])
    [completion] = router.generate([request])
    # 30 tokens: the first call and two continuations (each with what is left), then the forced answer.
    assert [r.max_tokens for r in backend.requests] == [None, 20, 10, 7]
    assert backend.requests[2].raw_continuation == "<think>\nI should write <search> your query</search> more</search>"
    assert completion.stops_in_reasoning == 3 and completion.reasoning_capped and completion.text == "Dijon"
    assert completion.completion_tokens == 32


def test_a_chat_message_continued_by_the_template_is_not_written_past():
    """Only a raw continuation can resume inside a think block; a `continue_final_message` request (the chat template
    continues the last message) keeps its stop."""
    backend = StopsInsideReasoning()
    routes = {"default": RoleRoute(backend="hf", enable_thinking=True, max_tokens=30)}
    router = Router(routes, backends={"hf": backend}, reasoning_cap=ReasoningCap(policy="none"))
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "So far"}]
    request = ChatRequest(role="reasoner", messages=messages, stop=["</search>"], continue_final_message=True)
    [completion] = router.generate([request])
    assert len(backend.requests) == 1 and completion.stops_in_reasoning == 0
