"""S3 (pat-jj/s3, s3/llm_agent/generation_s3.py): a searcher model gathers documents, a frozen generator answers
from the documents it kept.

Step 0: ONE retriever call gets every question's top-K ("the initial searched results"), shown in the searcher's
prompt as the first `<information>` block. Then each step, over every active question:
1. ONE backend call (role "searcher") continues each question's assistant turn, stopping at `</query>` (put back).
   The turn goes out raw after the generation prompt, so the searcher reads back exactly what it wrote, every
   `<think>` block included. In the new text outside its reasoning (the original reads the whole generation; see
   `baselines.base` for why we do not: a restated `<search_complete>True</search_complete>` ended the search):
   `<important_info>[ids]</important_info>` keeps those Doc numbers of the latest information
   block (once per block, ids outside the block ignored); `<search_complete>True</search_complete>` ends the
   search; otherwise `<query>{"query": "..."}</query>` (JSON, or the bare text when it is not JSON) is a search.
2. The queries of every searching question go to ONE retriever call; each question gets
   `\\n\\n<information>Doc i(Title: t) text ...</information>\\n\\n` spliced back. Output with neither a query nor
   the flag gets the original's nudge (ending in an open `<query>`) spliced back.
After `agent.max_searches` steps, one last searcher step runs whose query is not executed (the original's final
rollout), so its `<important_info>` still counts. Then ONE backend call (role "generator") answers every question
from its kept documents only: the kept documents of each block that got an `<important_info>`, then every
document of a block that never got one (as verl/utils/reward_score/rag_2.py builds the generator's context),
deduplicated by passage id.

Trace: round 1 is the initial retrieval; one round per searcher step after it; `extra.kept` lists the passage ids
kept from the block the step's `<important_info>` applied to; the generator call is the final call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial

from maps_train import safejson
from maps_train.agents.baselines.base import (
    BaselineEngine,
    Turn,
    actions_text,
    inside_thinking,
    model_piece,
    parsed_later,
    reopen_stop,
    search_r1_docs,
)
from maps_train.agents.baselines.vanilla import parse_direct
from maps_train.agents.engine import PendingCall, QuestionRun
from maps_train.agents.jsonparse import Parsed, bounded, cut_notes, first_tag_content, has_content
from maps_train.agents.outputs import BASELINE_QUERY_MAX_CHARS
from maps_train.agents.prompt_context import format_question, passage_body, truncate_words
from maps_train.agents.registry import register_method
from maps_train.questions import Question
from maps_train.records.trace import SubQueryHits, TraceRecord
from maps_train.retrieval.base import Hit

SEARCHER_PROMPT = "baselines/s3_searcher"
GENERATOR_PROMPT = "baselines/s3_generator"
QUERY_OPEN, QUERY_CLOSE = "<query>", "</query>"
# The original's nudge says "between <query> and </query>"; restated, that is a search for "and". Ours names the tag.
NUDGE = (
    "\n\nThe documents so far are not enough to answer the question. I will write a brand-new search query as JSON "
    "in the query tag:\n<query>\n"
)
_DOC_NUMBER = re.compile(r"[0-9]+")
MAX_DOC_DIGITS = 6  # a Doc number is small; a longer digit run is noise (and `int` refuses over 4,300 digits)
MAX_IMPORTANT = 100  # Doc numbers read from one `<important_info>` (ids outside the block are ignored anyway)


@dataclass
class S3Run(QuestionRun):
    letters: list[str] | None = None
    turn: Turn = field(default_factory=Turn)
    blocks: list[list[Hit]] = field(default_factory=list)  # information blocks in order, block 0 the initial one
    kept: dict[int, list[int]] = field(default_factory=dict)  # block index -> kept 1-based Doc numbers
    steps: int = 0


def parse_searcher(text: str, query_open: bool = False) -> Parsed:
    """{"complete": bool, "query": str | None, "important": [ints] | None} from one searcher turn.

    The backend drops the `</query>` stop tag; `query_open`: the context ended with an open `<query>` (the nudge),
    so the turn may start inside the query. Each tag is the first closed one (found in one pass, not by a lazy
    regex retried from every unclosed opener)."""
    notes = cut_notes(text)
    text = bounded(text)
    if query_open and QUERY_OPEN not in text:
        text = QUERY_OPEN + text
    text, _ = reopen_stop(text, QUERY_OPEN, QUERY_CLOSE)
    flag = first_tag_content(text, "<search_complete>", "</search_complete>")
    complete = flag is not None and flag.strip().lower() in ("true", "yes", "1", "y")
    important_text = first_tag_content(text, "<important_info>", "</important_info>")
    important = doc_numbers(important_text) if important_text is not None else None
    query = None
    query_block = first_tag_content(text, QUERY_OPEN, QUERY_CLOSE)
    if query_block is not None and not complete:
        query = query_text(query_block)
    ok = complete or bool(query)
    value = {"complete": complete, "query": query, "important": important}
    error = None if ok else "neither a query nor <search_complete>True</search_complete>"
    return Parsed(value, ok=ok, error=error, notes=notes)


def doc_numbers(text: str) -> list[int]:
    """The distinct Doc numbers in `text`, in order: runs of at most `MAX_DOC_DIGITS` digits, `MAX_IMPORTANT` at
    most."""
    numbers = (match.group() for match in _DOC_NUMBER.finditer(text))
    distinct = dict.fromkeys(int(number) for number in numbers if len(number) <= MAX_DOC_DIGITS)
    return list(distinct)[:MAX_IMPORTANT]


def query_text(raw: str) -> str | None:
    """The query inside `<query>`: JSON {"query": ...} (a list: its first item), else the raw text. A JSON object
    whose query is not a string with a letter or digit (null, a number, "...") is no query, never its Python
    spelling ("None")."""
    raw = bounded(raw).strip()
    try:
        data = safejson.loads(raw)
    except safejson.JSONLimitError:
        return _search_text(raw)
    if isinstance(data, dict) and "query" in data:
        value = data["query"]
        if isinstance(value, list):
            value = value[0] if value else None
        return _search_text(value)
    return _search_text(raw)


def _search_text(value: object) -> str | None:
    """A query worth searching: a string with a letter or digit, cut to `BASELINE_QUERY_MAX_CHARS`."""
    if not isinstance(value, str):
        return None
    value = safejson.scrub(value).strip()[:BASELINE_QUERY_MAX_CHARS].strip()
    return value if has_content(value) else None


def kept_documents(run: S3Run) -> list[Hit]:
    """The generator's documents: kept ones of marked blocks (in block order), then all of unmarked blocks."""
    ordered: list[Hit] = []
    for index, block in enumerate(run.blocks):
        if index in run.kept:
            ordered.extend(block[n - 1] for n in sorted(run.kept[index]) if 1 <= n <= len(block))
    for index, block in enumerate(run.blocks):
        if index not in run.kept:
            ordered.extend(block)
    unique: dict[str, Hit] = {}
    for hit in ordered:
        unique.setdefault(hit.id, hit)
    return list(unique.values())


def generator_documents(hits: list[Hit], max_words: int) -> str:
    if not hits:
        return "(no documents were kept)"
    return "\n\n".join(
        f"Doc {n} (Title: {hit.title})\n{truncate_words(passage_body(hit), max_words)}" for n, hit in enumerate(hits, 1)
    )


@register_method("s3")
class S3Engine(BaselineEngine):
    roles = ("searcher", "generator")  # the routes its calls take

    def prompt_names(self) -> list[str]:
        return [SEARCHER_PROMPT, GENERATOR_PROMPT, "baselines/answer_direct_short", "baselines/answer_direct_choice"]

    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        runs = [S3Run(question=q, letters=self.letters(q)) for q in questions]
        self._initial_search(runs)
        prompts = {
            id(run): self.prompts.render(
                SEARCHER_PROMPT,
                question=format_question(run.question),
                initial_information=search_r1_docs(run.blocks[0], self.agent.max_passage_words).strip(),
            )
            for run in runs
        }
        active = list(runs)
        while active:
            searching = self._step(active, prompts)
            self._search(searching)
            active = [run for run in active if not run.stop_reason]
        self._generate(runs)
        return [run.to_trace(self.method, self.config_digest) for run in runs]

    def _initial_search(self, runs: list[S3Run]) -> None:
        requests = [(run, run.question.question) for run in runs]
        for (run, query), hits in zip(requests, self.search(requests, self.agent.top_k)):
            round_ = run.start_round()
            round_.sub_queries = [query]
            round_.retrieved = [SubQueryHits(query=query, passage_ids=[h.id for h in hits])]
            round_.evidence_ids = [h.id for h in hits]
            round_.extra["action"] = "initial_search"
            run.blocks.append(list(hits))

    def _step(self, active: list[S3Run], prompts) -> list[tuple[S3Run, str]]:
        plans = [
            PendingCall(
                run=run,
                role="searcher",
                messages=run.turn.messages(prompts[id(run)]),
                parse=parsed_later,
                stop=[QUERY_CLOSE],
                shrink=run.turn.shrinker(),
            )
            for run in active
        ]
        inside = {id(run): inside_thinking(run.turn.text) for run in active}
        searching = []
        for plan, (call, _) in zip(plans, self.call_roles(plans)):
            run = plan.run
            run.steps += 1
            round_ = run.start_round()
            round_.calls.append(call)
            written = model_piece(call, inside[id(run)])
            nudged = run.turn.text.endswith(NUDGE)
            parsed = parse_searcher(actions_text(written, inside[id(run)]), query_open=nudged)
            piece, open_query = reopen_stop(written, QUERY_OPEN, QUERY_CLOSE)
            if nudged and QUERY_OPEN not in written and QUERY_CLOSE not in piece:
                piece, open_query = piece + QUERY_CLOSE, piece  # the nudge opened the query
            if open_query is not None and call.usage.finish_reason == "length":
                # Cut off inside the query by the token limit: the original sees no `</query>`, so no search.
                piece, parsed = written, Parsed({**parsed.value, "query": None}, ok=False, error="query cut off")
            self.record_parse(run, call, parsed)
            run.turn.add_model(piece)
            value = parsed.value
            latest = len(run.blocks) - 1
            if value["important"] is not None and latest not in run.kept:
                run.kept[latest] = [n for n in value["important"] if 1 <= n <= len(run.blocks[latest])]
                round_.extra["kept"] = [run.blocks[latest][n - 1].id for n in run.kept[latest]]
            round_.sufficient = value["complete"]
            if value["complete"]:
                run.stop_reason = "search_complete"
            elif run.steps > self.agent.max_searches:
                run.stop_reason = "max_searches"  # the final rollout: its query is not executed
            elif value["query"]:
                round_.sub_queries = [value["query"]]
                searching.append((run, value["query"]))
            else:
                round_.observation = NUDGE.strip()
                run.turn.add_tool(NUDGE)
            round_.extra["action"] = "complete" if value["complete"] else ("search" if value["query"] else "invalid")
        return searching

    def _search(self, searching: list[tuple[S3Run, str]]) -> None:
        for (run, query), hits in zip(searching, self.search(searching, self.agent.top_k)):
            round_ = run.current
            round_.retrieved = [SubQueryHits(query=query, passage_ids=[h.id for h in hits])]
            round_.evidence_ids = [h.id for h in hits]
            run.blocks.append(list(hits))
            block = f"\n\n<information>{search_r1_docs(hits, self.agent.max_passage_words).strip()}</information>\n\n"
            round_.observation = block.strip()
            run.turn.add_tool(block)

    def _generate(self, runs: list[S3Run]) -> None:
        plans = []
        for run in runs:
            documents = kept_documents(run)
            run.rounds[-1].extra["generator_passage_ids"] = [hit.id for hit in documents]
            messages = self.prompts.render(
                GENERATOR_PROMPT,
                documents=generator_documents(documents, self.agent.max_passage_words),
                question=format_question(run.question),
                answer_format=self.answer_format("direct", run.letters),
            )
            plans.append(
                PendingCall(run=run, role="generator", messages=messages, parse=partial(parse_direct, letters=run.letters))
            )
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            plan.run.final_call = call
            plan.run.final_answer = parsed.value["answer"]
