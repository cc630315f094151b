"""ParallelSearch (Tree-Shu-Zhao/ParallelSearch, a Search-R1 fork; search_r1/llm_agent/generation.py): the model
reasons in one assistant turn, and each search call may hold several sub-queries separated by `##`, all looked up
in one batched retrieval request; the full history stays in context.

Each step, over every active question:
1. ONE backend call (role "reasoner") continues each question's turn (sent raw after the generation prompt, so
   the model reads back exactly what it wrote, every `<think>` block included), stopping at `</search>` or
   `</answer>` (the dropped stop tag is put back).
2. The first `<search>...</search>` or `<answer>...</answer>` in the new text outside its reasoning is the
   action (the original reads the whole generation; see `baselines.base` for why we do not, and the backend
   writes past a stop tag inside the reasoning). An answer ends the question. An action cut off by the
   token limit (finish reason "length") is no action: its tag is not closed, and it counts as a parse failure
   (`extra.action` "truncated"). A search is split on `##`; the sub-queries of EVERY searching question go to
   ONE retriever call, and each question gets `\\n\\n<information>...</information>\\n\\n` spliced back:
   its sub-queries' top-K lists one after another ("Doc i(Title: t) text", numbered per sub-query, as the
   original concatenates them). Anything else gets the invalid-action note spliced back.
The original runs `max_turns` such steps and then one last generation whose searches are not executed; here that
bound is `agent.max_searches` (the paper's "up to 10 searches"), so a question ends by "answered",
"max_searches" (the last step searched again) or "no_answer" (the last step wrote neither). The answer is the
last closed `<answer>` the model wrote outside its reasoning (the option letter for multiple choice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from maps_train.agents.baselines.answers import extract_answer_tag
from maps_train.agents.baselines.base import (
    BaselineEngine,
    Turn,
    actions_text,
    inside_thinking,
    model_piece,
    parsed_later,
    search_r1_docs,
)
from maps_train.agents.engine import PendingCall, QuestionRun
from maps_train.agents.jsonparse import Parsed, bounded, cut_notes, has_content
from maps_train.agents.outputs import BASELINE_QUERY_MAX_CHARS
from maps_train.agents.prompt_context import format_question
from maps_train.agents.registry import register_method
from maps_train.questions import Question
from maps_train.records.trace import SubQueryHits, TraceRecord
from maps_train.retrieval.base import Hit

PROMPT = "baselines/parallel_search_reasoner"
STOPS = ["</search>", "</answer>"]
SUB_QUERY_SEPARATOR = "##"
# The original's note names both tags around "and" ("between <search> and </search>"): restated, it searched "and".
# Ours shows each tag pair around an ellipsis, which has no letter or digit: restated, it is no search and no answer.
INVALID_ACTION = (
    "\nMy last action was not valid. After my reasoning I must either search, with the query in <search>…</search> "
    "(sub-queries separated by ##), or answer, with the answer in <answer>…</answer>. Let me try again.\n"
)
ACTIONS = ("search", "answer")
_OPENER = re.compile(r"<(search|answer)>")
MAX_SUB_QUERIES = 16  # sub-queries of one search call searched; the rest are dropped (and noted)


@dataclass
class ParallelSearchRun(QuestionRun):
    letters: list[str] | None = None
    turn: Turn = field(default_factory=Turn)
    steps: int = 0


def close_open_tag(piece: str) -> str:
    """Put back the stop tag the backend dropped: the text ends inside `<search>` or `<answer>`, i.e. the last
    opener of some action comes after that action's last closer (the later such opener wins). Found with
    `rfind`, not a lookahead to the end of the text from every opener."""
    unclosed = []
    for action in ACTIONS:
        opened = piece.rfind(f"<{action}>")
        if opened >= 0 and piece.rfind(f"</{action}>") < opened:
            unclosed.append((opened, action))
    if not unclosed:
        return piece
    return piece + f"</{max(unclosed)[1]}>"


def first_action(text: str) -> tuple[str, str] | None:
    """(action, content) of the leftmost `<search>`/`<answer>` opener that its own closer follows -- what
    `<(search|answer)>(.*?)</\\1>` finds -- in linear time: an opener can close only if it comes before its
    action's last closer."""
    last_closer = {action: text.rfind(f"</{action}>") for action in ACTIONS}
    for match in _OPENER.finditer(text):
        action = match.group(1)
        if match.end() <= last_closer[action]:
            return action, text[match.end() : text.find(f"</{action}>", match.end())]
    return None


def parse_action(text: str, cut_off: bool = False) -> Parsed:
    """{"action": "search" | "answer" | None, "content", "sub_queries"} from the first action tag.

    The backend drops the stop tag, so a tag left open at the end is closed first, unless `cut_off`: the token
    limit ended the text, and an action it cut off never closed (as in the original, it is no action)."""
    notes = cut_notes(text)
    text = bounded(text)
    found = first_action(text if cut_off else close_open_tag(text))
    if not found:
        cut = cut_off and close_open_tag(text) != text
        return Parsed(
            {"action": None, "content": "", "sub_queries": []},
            ok=False,
            error="action cut off by the token limit" if cut else "no <search> or <answer> tag",
            notes=notes,
        )
    action, content = found[0], found[1].strip()
    if action == "answer" and not has_content(content):  # a restated placeholder ("…"): no letter or digit
        return Parsed(
            {"action": None, "content": content, "sub_queries": []}, ok=False, error="empty answer", notes=notes
        )
    sub_queries = split_sub_queries(content) if action == "search" else []
    if action == "search" and not sub_queries:
        return Parsed(
            {"action": None, "content": content, "sub_queries": []}, ok=False, error="empty search", notes=notes
        )
    if len(sub_queries) > MAX_SUB_QUERIES:
        notes.append(f"{len(sub_queries)} sub-queries; the first {MAX_SUB_QUERIES} searched")
        sub_queries = sub_queries[:MAX_SUB_QUERIES]
    return Parsed({"action": action, "content": content, "sub_queries": sub_queries}, ok=True, notes=notes)


def split_sub_queries(content: str) -> list[str]:
    """The `##`-separated sub-queries that say something (a letter or digit), each cut to
    `BASELINE_QUERY_MAX_CHARS`."""
    parts = (part.strip()[:BASELINE_QUERY_MAX_CHARS].strip() for part in content.split(SUB_QUERY_SEPARATOR))
    return [part for part in parts if has_content(part)]


def information_block(hit_lists: list[list[Hit]], max_words: int) -> str:
    body = "".join(search_r1_docs(hits, max_words) for hits in hit_lists)
    return f"\n\n<information>{body.strip()}</information>\n\n"


@register_method("parallel_search")
class ParallelSearchEngine(BaselineEngine):
    roles = ("reasoner",)  # the routes its calls take

    def prompt_names(self) -> list[str]:
        return [PROMPT, "baselines/answer_tag_short", "baselines/answer_tag_choice"]

    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        runs = [ParallelSearchRun(question=q, letters=self.letters(q)) for q in questions]
        prompts = {
            id(run): self.prompts.render(
                PROMPT, question=format_question(run.question), answer_format=self.answer_format("tag", run.letters)
            )
            for run in runs
        }
        active = list(runs)
        while active:
            searching = self._step(active, prompts)
            self._search(searching)
            active = [run for run in active if not run.stop_reason]
        for run in runs:
            answer, how = extract_answer_tag(run.turn.actions_text, run.letters)
            run.final_answer = answer
            run.rounds[-1].extra["answer_format"] = how
        return [run.to_trace(self.method, self.config_digest) for run in runs]

    def _step(self, active: list[ParallelSearchRun], prompts) -> list[tuple[ParallelSearchRun, list[str]]]:
        plans = [
            PendingCall(
                run=run,
                role="reasoner",
                messages=run.turn.messages(prompts[id(run)]),
                parse=parsed_later,
                stop=STOPS,
                shrink=run.turn.shrinker(),
            )
            for run in active
        ]
        inside = {id(run): inside_thinking(run.turn.text) for run in active}
        searching = []
        for plan, (call, _) in zip(plans, self.call_roles(plans)):
            run = plan.run
            run.steps += 1
            last_step = run.steps > self.agent.max_searches  # the original's final rollout: no search is run
            round_ = run.start_round()
            round_.calls.append(call)
            written = model_piece(call, inside[id(run)])
            cut_off = call.usage.finish_reason == "length"
            outside = actions_text(written, inside[id(run)])
            parsed = self.record_parse(run, call, parse_action(outside, cut_off=cut_off))
            run.turn.add_model(written if cut_off else close_open_tag(written))
            action = parsed.value["action"]
            round_.extra["action"] = action or ("truncated" if cut_off else "invalid")
            if action == "answer":
                run.stop_reason = "answered"
            elif last_step:
                run.stop_reason = "max_searches" if action == "search" else "no_answer"
            elif action == "search":
                round_.sub_queries = list(parsed.value["sub_queries"])
                searching.append((run, round_.sub_queries))
            else:
                round_.observation = INVALID_ACTION.strip()
                run.turn.add_tool(INVALID_ACTION)
        return searching

    def _search(self, searching: list[tuple[ParallelSearchRun, list[str]]]) -> None:
        """Every sub-query of every searching question in ONE retriever call."""
        requests = [(run, query) for run, queries in searching for query in queries]
        hit_lists = iter(self.search(requests, self.agent.top_k))
        for run, queries in searching:
            per_query = [next(hit_lists) for _ in queries]
            round_ = run.current
            round_.retrieved = [
                SubQueryHits(query=q, passage_ids=[h.id for h in hits]) for q, hits in zip(queries, per_query)
            ]
            round_.evidence_ids = list(dict.fromkeys(h.id for hits in per_query for h in hits))
            block = information_block(per_query, self.agent.max_passage_words)
            round_.observation = block.strip()
            run.turn.add_tool(block)
