"""Search-o1 (RUC-NLPIR/Search-o1, scripts/run_search_o1.py): reasoning with search calls inside it, each
search's passages condensed by a "reason-in-documents" call, the condensed findings spliced back into the
reasoning, the full history kept in context.

Each turn, over every active question:
1. ONE backend call (role "reasoner") continues each question's assistant turn; generation stops at
   `<|end_search_query|>` (the backend drops the marker; it is put back).
2. A turn that ends inside a query is a search call. A query already made gets a refusal spliced back; past
   `agent.max_searches` searches, a "limit reached" note; otherwise the query joins the step's ONE retriever call.
   A turn without a query ends the question ("answered").
3. ONE backend call (role "condenser") condenses each searched question's passages, given the question, its
   reasoning abridged (first step, last 4 steps, every step with a search marker) and the query; the text after
   "**Final Information**" is spliced back between `<|begin_search_result|>` and `<|end_search_result|>`.
A question also stops after `agent.max_turns` reasoner turns ("max_turns"). The answer is the last `\\boxed{}`
(then an "Answer:" line) in what the reasoner wrote; the option letter for multiple choice.

The turn is continued as the original does, as a raw prompt (`baselines.base.RawTurnBackend`): the chat template
renders the conversation once, then the model's partial turn (its `<think>` blocks, the closed queries and the
spliced results) follows as raw text, byte for byte, with thinking on or off. The query is read from what the
model wrote outside its reasoning. Departure: the original's QwQ searched from inside its reasoning (it had no
think tags); with Qwen3 thinking, a marker inside `<think>` is not a search (the backend writes past its end
marker, `maps_train.llm.budget`), because Qwen3 restates the instruction there and searched "your search query".
The model searches after closing its reasoning and may think again after the results.

Trace: one round per turn; its calls are the reasoner's and (when it searched) the condenser's; `extra.action`
is "search", "repeat_refused", "limit_refused", "answer" or "truncated"; `observation` is the spliced text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from maps_train.agents.baselines.answers import extract_reasoned_answer
from maps_train.agents.baselines.base import (
    BaselineEngine,
    Turn,
    actions_text,
    inside_thinking,
    model_piece,
    reopen_stop,
)
from maps_train.agents.engine import PendingCall, QuestionRun
from maps_train.agents.jsonparse import Parsed, bounded, cut_notes, has_content
from maps_train.agents.outputs import BASELINE_QUERY_MAX_CHARS
from maps_train.agents.prompt_context import LEFT_OUT, OBSERVATIONS_ORDER, format_question, passages_slot
from maps_train.agents.prompting import ShrinkableSlot
from maps_train.agents.registry import register_method
from maps_train.questions import Question
from maps_train.records.trace import RoleCall, SubQueryHits, TraceRecord

BEGIN_QUERY = "<|begin_search_query|>"
END_QUERY = "<|end_search_query|>"
BEGIN_RESULT = "<|begin_search_result|>"
END_RESULT = "<|end_search_result|>"
INFO_HEADING = "**Final Information**"
NO_INFO = "No helpful information found."
REPEAT_REFUSAL = "This query was already searched. Use the results you already have."
LIMIT_REFUSAL = "The search limit has been reached. No more searches are allowed; continue with what you know."

REASONER_PROMPT = "baselines/search_o1_reasoner"
CONDENSER_PROMPT = "baselines/search_o1_condenser"


@dataclass
class SearchO1Run(QuestionRun):
    letters: list[str] | None = None
    turn: Turn = field(default_factory=Turn)
    searches: int = 0
    executed: set[str] = field(default_factory=set)


def result_block(text: str) -> str:
    return f"\n\n{BEGIN_RESULT}{text}{END_RESULT}\n\n"


def _deferred(_: str) -> Parsed:
    """The reasoner's parse runs on the whole turn piece (reasoning included) in `_reason`, not on the answer."""
    return Parsed({"query": None}, ok=True)


def parse_reasoner(text: str) -> Parsed:
    """The turn's search query (the content of an unclosed or closed last query marker), or none. A query with
    no letter or digit is not a search (counted as a parse failure); a longer one than
    `BASELINE_QUERY_MAX_CHARS` is cut."""
    notes = cut_notes(text)
    text = bounded(text, keep="tail")  # the query marker that matters is the last one
    start = text.rfind(BEGIN_QUERY)
    if start < 0:
        return Parsed({"query": None}, ok=True, notes=notes)
    query, closed, after = text[start + len(BEGIN_QUERY) :].partition(END_QUERY)
    if closed and after.strip():
        return Parsed({"query": None}, ok=True, notes=notes)  # a closed query followed by more text is not a call
    query = query.strip()[:BASELINE_QUERY_MAX_CHARS].strip()
    if not has_content(query):
        return Parsed({"query": None}, ok=False, error="empty search query", notes=notes)
    return Parsed({"query": query}, ok=True, notes=notes)


def abridge_reasoning(reasoning: str) -> str:
    """The reasoning as numbered steps (one per non-empty line), keeping the first step, the last four and every
    step holding a search marker when there are more than five; "..." stands for each run of skipped steps."""
    lines = [line.strip() for line in reasoning.replace("\n\n", "\n").split("\n") if line.strip()]
    steps = [f"Step {number}: {line}" for number, line in enumerate(lines, start=1)]
    if len(steps) <= 5:
        return "\n\n".join(steps)
    kept: list[str] = []
    for i, step in enumerate(steps):
        if i == 0 or i >= len(steps) - 4 or BEGIN_QUERY in step or BEGIN_RESULT in step:
            kept.append(step)
        elif not kept or kept[-1] != "...":
            kept.append("...")
    return "\n\n".join(kept)


def abridged_slot(reasoning: str) -> ShrinkableSlot:
    """`abridge_reasoning` as a slot: step k leaves out the k oldest steps after the first (the newest stays)."""
    steps = abridge_reasoning(reasoning).split("\n\n")

    def text(k: int) -> str:
        if k <= 0:
            return "\n\n".join(steps)
        return "\n\n".join([steps[0], f"(earlier steps {LEFT_OUT})", *steps[1 + k :]])

    return ShrinkableSlot(max(0, len(steps) - 2), text, OBSERVATIONS_ORDER)


def parse_condensed(text: str) -> Parsed:
    """The text after the last "**Final Information**" heading, on one line; the original's "No helpful
    information found." when the heading is missing or nothing with a letter or digit follows it (counted as a
    parse failure)."""
    notes = cut_notes(text)
    text = bounded(text, keep="tail")  # the heading that matters is the last one
    if INFO_HEADING not in text:
        error = "no **Final Information** heading; fallback: no information"
        return Parsed({"information": NO_INFO}, ok=False, error=error, notes=notes)
    info = " ".join(text.rsplit(INFO_HEADING, 1)[1].strip().strip("`").split())
    if not has_content(info):
        return Parsed({"information": NO_INFO}, ok=False, error="empty information", notes=notes)
    return Parsed({"information": info}, ok=True, notes=notes)


@register_method("search_o1")
class SearchO1Engine(BaselineEngine):
    roles = ("reasoner", "condenser")  # the routes its calls take

    def prompt_names(self) -> list[str]:
        return [REASONER_PROMPT, CONDENSER_PROMPT, "baselines/answer_boxed_short", "baselines/answer_boxed_choice"]

    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        runs = [SearchO1Run(question=q, letters=self.letters(q)) for q in questions]
        prompts = {
            id(run): self.prompts.render(
                REASONER_PROMPT,
                max_searches=self.agent.max_searches,
                question=format_question(run.question),
                answer_format=self.answer_format("boxed", run.letters),
            )
            for run in runs
        }
        active = list(runs)
        while active:
            searching = self._reason(active, prompts)
            self._search_and_condense(searching)
            for run in active:
                if not run.stop_reason and len(run.rounds) >= self.agent.max_turns:
                    run.stop_reason = "max_turns"
            active = [run for run in active if not run.stop_reason]
        for run in runs:
            answer, how = extract_reasoned_answer(run.turn.actions_text, run.letters)
            run.final_answer = answer
            run.rounds[-1].extra["answer_format"] = how
        return [run.to_trace(self.method, self.config_digest) for run in runs]

    def _reason(
        self, active: list[SearchO1Run], prompts: dict[int, list[dict[str, str]]]
    ) -> list[tuple[SearchO1Run, str]]:
        """One reasoner turn for every active question; returns the (question, query) pairs to search now."""
        plans = [
            PendingCall(
                run=run,
                role="reasoner",
                messages=run.turn.messages(prompts[id(run)]),
                parse=_deferred,
                stop=[END_QUERY],
                shrink=run.turn.shrinker(),
            )
            for run in active
        ]
        inside = {id(run): inside_thinking(run.turn.text) for run in active}
        searching = []
        for plan, (call, _) in zip(plans, self.call_roles(plans)):
            run = plan.run
            round_ = run.start_round()
            round_.calls.append(call)
            written = model_piece(call, inside[id(run)])
            query = self._parse_turn(run, call, actions_text(written, inside[id(run)]))
            piece, open_query = reopen_stop(written, BEGIN_QUERY, END_QUERY)
            if open_query is not None and call.usage.finish_reason == "length":
                query = None  # cut off inside a query by the token limit: not a search call
                piece = written
            run.turn.add_model(piece)
            if not query:
                round_.extra["action"] = "truncated" if call.usage.finish_reason == "length" else "answer"
                run.stop_reason = "answered"
                continue
            round_.sub_queries = [query]
            if run.searches >= self.agent.max_searches:  # checked before repetition, as in the original
                round_.extra["action"] = "limit_refused"
                round_.observation = LIMIT_REFUSAL
                run.turn.add_tool(result_block(LIMIT_REFUSAL))
            elif query in run.executed:
                round_.extra["action"] = "repeat_refused"
                round_.observation = REPEAT_REFUSAL
                run.turn.add_tool(result_block(REPEAT_REFUSAL))
            else:
                round_.extra["action"] = "search"
                run.searches += 1
                run.executed.add(query)
                searching.append((run, query))
        return searching

    @staticmethod
    def _parse_turn(run: SearchO1Run, call: RoleCall, written: str) -> str | None:
        """The turn's query, parsed from what the model wrote outside its reasoning; recorded on the call and
        counted as a parse failure like any role output."""
        parsed = parse_reasoner(written)
        call.parsed, call.parse_ok, call.parse_error = parsed.value, parsed.ok, parsed.error
        if not parsed.ok:
            run.parse_failures["reasoner"] += 1
        return parsed.value["query"]

    def _search_and_condense(self, searching: list[tuple[SearchO1Run, str]]) -> None:
        hit_lists = self.search(searching, self.agent.top_k)
        plans = []
        for (run, query), hits in zip(searching, hit_lists):
            round_ = run.current
            round_.retrieved = [SubQueryHits(query=query, passage_ids=[h.id for h in hits])]
            round_.evidence_ids = [h.id for h in hits]
            messages, shrink = self.prompts.render_shrinkable(
                CONDENSER_PROMPT,
                question=format_question(run.question),
                previous_reasoning=abridged_slot(run.turn.text),
                query=query,
                passages=passages_slot(hits, self.agent.max_passage_words),
            )
            plans.append(
                PendingCall(run=run, role="condenser", messages=messages, parse=parse_condensed, shrink=shrink)
            )
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            info = parsed.value["information"]
            plan.run.current.calls.append(call)
            plan.run.current.observation = info
            plan.run.turn.add_tool(result_block(info))
