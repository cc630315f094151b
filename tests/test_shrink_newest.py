"""A continued turn over the context keeps its newest evidence (issue 46), through the real Qwen3 and Qwen3.6
templates with the tiny Qwen3's tokenizer counting every prompt (`TemplateModel` with `max_model_len`: each
request fitted by `fit_request`, as the hf and vLLM backends fit it).

At the CPU study's settings (4,096 context, 256 output tokens, top-5, 120-word passages) one ParallelSearch search
with 5 sub-queries returns more than the room: the next prompt must hold the model's own last search and the newest
`<information>` block, cut in the middle; older turns shrink before it; no reasoning block loses its `</think>`; and
the reasoning cap's follow-up goes through the same shrinker, keeping the stop-thinking sentence and `</think>`.
"""

from __future__ import annotations

import pytest
import test_qwen3_templates
from test_qwen3_templates import THINK, run_through_template, steps

from maps_train.llm.budget import REASONING_CAP_CLOSE, ReasoningCap
from maps_train.llm.prompt_fit import CUT_MARK
from maps_train.retrieval.base import Hit

tokenizers = test_qwen3_templates.tokenizers  # the fixture: the tiny Qwen3 tokenizer with each real template
CONTEXT, OUTPUT = 4096, 256
THINKING = ["qwen3-thinking", "qwen3.6-thinking"]
WORDS = "the tower engineer was born in a city of the region where iron bridges were built and painted".split()
SUB_QUERIES = ["Eiffel Tower engineer", "Gustave Eiffel birthplace", "Dijon region", "Eiffel company", "Garabit"]


class PassageRetriever:
    """Every query gets k passages of `words` words, each passage's first and last words naming it."""

    def __init__(self, words: int = 120):
        self.words, self.calls = words, 0

    def search(self, queries, k):
        self.calls += 1
        out = []
        for q, query in enumerate(queries):
            hits = []
            for rank in range(k):
                name = f"s{self.calls}q{q}r{rank}"
                body = " ".join(WORDS[(rank + j) % len(WORDS)] for j in range(self.words - 2))
                hits.append(Hit(f"{name}", f"{query} {rank}", f"START{name} {body} END{name}", 0.0))
            out.append(hits)
        return out


def turn_of(prompt: str) -> str:
    """The assistant turn of a rendered prompt (after the generation prompt's opener)."""
    return prompt.rsplit("<|im_start|>assistant\n", 1)[-1]


def blocks_closed(turn: str) -> bool:
    """Every think block of `turn` (a rendered prompt's, the template's own opener included) is closed."""
    depth = 0
    position = 0
    while True:
        opener, closer = turn.find("<think>", position), turn.find("</think>", position)
        if opener < 0 and closer < 0:
            return depth == 0
        if closer < 0 or 0 <= opener < closer:
            depth, position = depth + 1, opener + len("<think>")
        else:
            depth, position = depth - 1, closer + len("</think>")
            if depth < 0:
                return False


FIVE = " ## ".join(SUB_QUERIES)
ONE_BIG_SEARCH = steps(
    f"{THINK}Five facts to look up at once.\n</think>\n\n<search>{FIVE}</search>",
    f"{THINK}Gustave Eiffel, born in Dijon.\n</think>\n\n<answer>Dijon</answer>",
)


@pytest.mark.parametrize("case", THINKING)
def test_the_next_prompt_holds_its_last_search_and_the_newest_results_cut_in_the_middle(tokenizers, case):
    (trace,), model = run_through_template(
        tokenizers, case, ["agent.method=parallel_search", "agent.top_k=5", "agent.max_passage_words=120"],
        {"reasoner": ONE_BIG_SEARCH}, max_tokens=OUTPUT, max_model_len=CONTEXT, retriever=PassageRetriever(),
    )
    first, second = model.calls("reasoner")
    fitted = model.fitted[1]
    assert fitted.dropped > 0 and len(fitted.ids) <= CONTEXT - OUTPUT  # the block was bigger than the room
    turn = turn_of(second.prompt)
    assert f"<search>{FIVE}</search>" in turn  # its own last search
    # the newest results: the block's head and tail (the first and the last passage's ends), its middle cut out
    assert "<information>Doc 1(Title: Eiffel Tower engineer 0) STARTs1q0r0" in turn
    assert turn.rstrip().endswith("ENDs1q4r4</information>")
    assert CUT_MARK.strip() in turn and "STARTs1q2r2" not in turn
    assert blocks_closed(turn) and turn.count("</think>") == 1
    assert trace.rounds[1].calls[0].usage.prompt_tokens_dropped == fitted.dropped
    assert trace.final_answer == "Dijon"


TWO_SEARCHES = steps(
    f"{THINK}First the engineer.\n</think>\n\n<search>Eiffel Tower engineer ## Eiffel company</search>",
    f"{THINK}Now his birthplace.\n</think>\n\n<search>Gustave Eiffel birthplace ## Dijon region</search>",
    f"{THINK}Born in Dijon.\n</think>\n\n<answer>Dijon</answer>",
)


@pytest.mark.parametrize("case", THINKING)
def test_older_turns_shrink_first_and_every_reasoning_block_stays_closed(tokenizers, case):
    # 2 sub-queries x top-5 x 120 words: one block fits the room, two do not.
    (trace,), model = run_through_template(
        tokenizers, case, ["agent.method=parallel_search", "agent.top_k=5", "agent.max_passage_words=120"],
        {"reasoner": TWO_SEARCHES}, max_tokens=OUTPUT, max_model_len=CONTEXT, retriever=PassageRetriever(),
    )
    assert model.fitted[1].dropped == 0 and model.fitted[2].dropped > 0
    turn = turn_of(model.calls("reasoner")[2].prompt)
    # the newest block whole, every passage from its first to its last word
    assert all(f"STARTs2q{q}r{r}" in turn and f"ENDs2q{q}r{r}" in turn for q in range(2) for r in range(5))
    assert "<search>Gustave Eiffel birthplace ## Dijon region</search>" in turn  # the last action
    assert "STARTs1q1r4" not in turn  # the older block lost passages first
    assert blocks_closed(turn) and "Now his birthplace." in turn
    assert trace.final_answer == "Dijon"


LONG_THOUGHT = " ".join(f"step{i} weighs the tower and the city" for i in range(40))
CAPPED = steps(
    f"{THINK}Five facts to look up at once.\n</think>\n\n<search>{FIVE}</search>",
    (f"{THINK}{LONG_THOUGHT}", "length"),  # the reasoning runs into max_tokens
    "<answer>Dijon</answer>",  # the follow-up's answer
)


@pytest.mark.parametrize("case", THINKING)
def test_the_reasoning_cap_follow_up_goes_through_the_same_shrinker(tokenizers, case):
    (trace,), model = run_through_template(
        tokenizers, case,
        ["agent.method=parallel_search", "agent.top_k=5", "agent.max_passage_words=120", "agent.max_searches=1"],
        {"reasoner": CAPPED}, max_tokens=OUTPUT, max_model_len=CONTEXT, retriever=PassageRetriever(),
        reasoning_cap=ReasoningCap(answer_tokens=64),
    )
    follow_up = model.calls("reasoner")[2]
    turn = turn_of(follow_up.prompt)
    assert len(model.fitted[2].ids) <= CONTEXT - 64
    assert turn.endswith(REASONING_CAP_CLOSE)  # the stop-thinking sentence and `</think>` stayed
    assert f"<search>{FIVE}</search>" in turn and "ENDs1q4r4</information>" in turn
    assert blocks_closed(turn)
    call = trace.rounds[1].calls[0]
    assert call.usage.reasoning_capped and trace.final_answer == "Dijon"
    # the follow-up's own dropped tokens are booked beside the capped call's
    assert call.usage.prompt_tokens_dropped == model.fitted[1].dropped + model.fitted[2].dropped
    assert model.fitted[2].dropped > 0
