"""The MAPS engine: proposer -> writer (one sub-query per direction) -> one batched search -> consolidator,
round after round, over a batch of questions; then one batched answer call.

Round t of a question sees only the question, the observations o_1..o_{t-1} and the compressed reasoning state;
past sub-queries never reach a prompt. Ablations are switches of this same engine:
- `agent.use_directions=false`: no proposer; the writer writes the N sub-queries directly in one call;
- `agent.num_directions=1`: no parallelism;
- `agent.decoupled=false`: every role also sees the full trajectory (past directions, sub-queries, retrieved
  passages, observations and states), through the `*_coupled` prompt files.

Each step makes ONE backend call per role for all active questions (the writer's covers N calls per question) and
ONE retriever call for all their sub-queries; a question leaves the batch when its consolidator says the knowledge
suffices (obeyed from round `agent.min_rounds` on) or at `agent.max_rounds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from maps_train.agents.engine import Engine, PendingCall, QuestionRun
from maps_train.agents.outputs import (
    answer_schema,
    consolidation_schema,
    directions_schema,
    option_letters,
    parse_answer,
    parse_consolidation,
    parse_directions,
    parse_queries,
    parse_query,
    queries_schema,
    query_schema,
)
from maps_train.agents.prompt_context import (
    TRAJECTORY_ORDER,
    first_sentences,
    format_passages,
    format_question,
    format_state,
    left_out_note,
    merge_hits,
    observations_slot,
    passages_slot,
)
from maps_train.agents.prompting import ShrinkableSlot
from maps_train.agents.registry import register_method
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.records.hints import HINT_SEPARATOR, gold_title_hint, searched_ids
from maps_train.records.trace import QUESTION_SEARCHED, RoundRecord, SubQueryHits, TraceRecord
from maps_train.retrieval.base import Hit

NO_EARLIER_ROUNDS = "(no earlier rounds)"


@dataclass
class MapsRun(QuestionRun):
    observations: list[str] = field(default_factory=list)  # o_1..o_t
    state: str = ""  # the compressed reasoning state after the last round
    letters: list[str] | None = None  # option letters in multiple-choice mode
    evidence: list[Hit] = field(default_factory=list)  # this round's merged passages
    history: list[tuple[RoundRecord, list[Hit]]] = field(default_factory=list)  # for the no-decoupling ablation


def resolve_letters(question: Question, answer_mode: str) -> list[str] | None:
    """Option letters when the question is answered by choice, else None (short answer)."""
    if answer_mode == "choice" or (answer_mode == "auto" and question.options):
        if not question.options:
            raise MapsTrainError(f"agent.answer_mode=choice: question '{question.id}' has no options")
        return option_letters(len(question.options))
    return None


def trajectory_slot(history: list[tuple[RoundRecord, list[Hit]]], max_words: int) -> ShrinkableSlot:
    """`format_trajectory` as a slot: step k leaves out the k oldest rounds."""

    def text(k: int) -> str:
        if k <= 0:
            return format_trajectory(history, max_words)
        note = left_out_note("round", "1", str(k))
        return note if k >= len(history) else note + "\n\n" + format_trajectory(history[k:], max_words)

    return ShrinkableSlot(len(history), text, TRAJECTORY_ORDER)


def format_trajectory(history: list[tuple[RoundRecord, list[Hit]]], max_words: int) -> str:
    """Earlier rounds in full, for the no-decoupling ablation."""
    if not history:
        return NO_EARLIER_ROUNDS
    blocks = []
    for round_, hits in history:
        lines = [f"Round {round_.index}"]
        if round_.directions:
            lines.append("Directions:")
            lines.extend(f"- {d}" for d in round_.directions)
        lines.append("Search queries:")
        lines.extend(f"- {q}" for q in round_.sub_queries)
        lines.append("Retrieved passages:")
        lines.append(format_passages(hits, max_words))
        lines.append(f"Observation: {round_.observation or ''}")
        lines.append(f"Reasoning state after this round: {format_state(round_.state or '')}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


@register_method("maps")
class MapsEngine(Engine):
    roles = ("proposer", "writer", "consolidator", "answer")  # the routes its calls take

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("num_directions", "max_rounds", "top_k"):
            if getattr(self.agent, name) < 1:
                raise MapsTrainError(f"agent.{name}: must be at least 1, got {getattr(self.agent, name)}")

    # -- prompts ---------------------------------------------------------------------------------------------
    def _prompt(self, role_file: str) -> str:
        return f"maps/{role_file}" + ("" if self.agent.decoupled else "_coupled")

    def prompt_names(self) -> list[str]:
        writers = ["proposer", "writer"] if self.agent.use_directions else ["writer_direct"]
        return [self._prompt(name) for name in writers + ["consolidator", "answer_short", "answer_choice"]]

    def _context(self, run: MapsRun) -> dict[str, object]:
        """The inputs every role gets: question, observations, state (plus the trajectory when coupled). The
        observations and the trajectory are `ShrinkableSlot`s: a backend whose context the prompt does not fit
        leaves out the oldest rounds first (never the question or the state)."""
        context: dict[str, object] = {
            "question": format_question(run.question),
            "observations": observations_slot(run.observations),
            "state": format_state(run.state),
        }
        if not self.agent.decoupled:
            context["trajectory"] = trajectory_slot(run.history, self.agent.max_passage_words)
        return context

    def _plan(self, run: MapsRun, role: str, prompt: str, parse, json_schema: dict, **fields: object) -> PendingCall:
        """One call of `role` for `run`: prompt file `prompt` rendered with the shared context plus `fields`."""
        messages, shrink = self.prompts.render_shrinkable(self._prompt(prompt), **fields, **self._context(run))
        return PendingCall(run=run, role=role, messages=messages, parse=parse, json_schema=json_schema, shrink=shrink)

    # -- the loop --------------------------------------------------------------------------------------------
    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        runs = [MapsRun(question=q, letters=resolve_letters(q, self.agent.answer_mode)) for q in questions]
        active = list(runs)
        while active:
            for run in active:
                run.start_round()
            self._write_sub_queries(active)
            if self.agent.search_question:
                self._search_question_first(active)
            self._retrieve(active)
            self._consolidate(active)
            active = [run for run in active if not self._stopped(run)]
        self._answer(runs)
        return [run.to_trace(self.method, self.config_digest) for run in runs]

    def _stopped(self, run: MapsRun) -> bool:
        if run.current.sufficient and len(run.rounds) >= self.agent.min_rounds:
            run.stop_reason = "sufficient"
        elif len(run.rounds) >= self.agent.max_rounds:
            run.stop_reason = "max_rounds"
        return bool(run.stop_reason)

    def _write_sub_queries(self, active: list[MapsRun]) -> None:
        n = self.agent.num_directions
        if not self.agent.use_directions:
            lists = self._string_lists(active, "writer_direct", "queries", parse_queries, queries_schema(n), "writer")
            for run, queries in zip(active, lists):
                run.current.sub_queries = queries
            return
        lists = self._string_lists(active, "proposer", "directions", parse_directions, directions_schema(n))
        for run, directions in zip(active, lists):
            run.current.directions = directions

        plans = [self._writer_plan(run, direction) for run in active for direction in run.current.directions]
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            plan.run.current.calls.append(call)
            plan.run.current.sub_queries.append(parsed.value["query"])

    @staticmethod
    def _search_question_first(active: list[MapsRun]) -> None:
        """`agent.search_question`: round 1 searches the question text before the written sub-queries; the round
        records it (`extra.question_searched`) so credit and the analyses tell it from what the writer wrote."""
        for run in active:
            if len(run.rounds) == 1:
                run.current.sub_queries.insert(0, run.question.question)
                run.current.extra[QUESTION_SEARCHED] = True

    def _writer_plan(self, run: MapsRun, direction: str) -> PendingCall:
        """The writer's call for one direction; with `agent.hint: gold_titles` (teacher traces only), the direction
        carries the titles of the gold passages its prompt names and no search has found (`records.hints`)."""
        parse = partial(parse_query, direction=direction)
        plan = self._plan(run, "writer", "writer", parse, query_schema(), direction=direction)
        if self.agent.hint != "gold_titles":
            return plan
        visible = " ".join(message["content"] for message in plan.messages if message["role"] == "user")
        hint = gold_title_hint(run.gold, visible, searched_ids(run.rounds), run.passages)
        if hint is None:
            return plan
        hinted = self._plan(run, "writer", "writer", parse, query_schema(), direction=direction + HINT_SEPARATOR + hint)
        return replace(hinted, hint=hint)

    def _string_lists(
        self, active: list[MapsRun], prompt: str, key: str, parse, schema: dict, role: str | None = None
    ) -> list[list[str]]:
        """One call per run whose output is a list of N strings under `key` (directions, or direct sub-queries)."""
        n = self.agent.num_directions
        slot = {"num_directions" if key == "directions" else "num_queries": str(n)}
        plans = [
            self._plan(run, role or prompt, prompt, partial(parse, n=n, question=run.question.question), schema, **slot)
            for run in active
        ]
        lists = []
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            plan.run.current.calls.append(call)
            lists.append(list(parsed.value[key]))
        return lists

    def _retrieve(self, active: list[MapsRun]) -> None:
        requests = [(run, query) for run in active for query in run.current.sub_queries]
        hit_lists = self.search(requests, self.agent.top_k)
        per_run: dict[int, list[list[Hit]]] = {}
        for (run, query), hits in zip(requests, hit_lists):
            run.current.retrieved.append(SubQueryHits(query=query, passage_ids=[hit.id for hit in hits]))
            per_run.setdefault(id(run), []).append(hits)
        for run in active:
            run.evidence = merge_hits(per_run.get(id(run), []))
            run.current.evidence_ids = [hit.id for hit in run.evidence]

    def _consolidate(self, active: list[MapsRun]) -> None:
        plans = [
            self._plan(
                run,
                "consolidator",
                "consolidator",
                partial(
                    parse_consolidation, previous_state=run.state, fallback_observation=first_sentences(run.evidence)
                ),
                consolidation_schema(),
                evidence=passages_slot(run.evidence, self.agent.max_passage_words),
            )
            for run in active
        ]
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            run = plan.run
            run.current.calls.append(call)
            run.observations.append(parsed.value["observation"])
            run.state = parsed.value["state"]
            run.current.observation = parsed.value["observation"]
            run.current.state = run.state
            # Only a clean parse may end the search (the parser also reads a failed one as not sufficient).
            run.current.sufficient = parsed.ok and parsed.value["sufficient"] is True
            if not self.agent.decoupled:
                run.history.append((run.current, run.evidence))

    def _answer(self, runs: list[MapsRun]) -> None:
        plans = [
            self._plan(
                run,
                "answer",
                "answer_choice",
                partial(parse_answer, letters=run.letters),
                answer_schema(run.letters),
                letters=", ".join(run.letters),
            )
            if run.letters
            else self._plan(
                run, "answer", "answer_short", partial(parse_answer, letters=run.letters), answer_schema(run.letters)
            )
            for run in runs
        ]
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            plan.run.final_call = call
            plan.run.final_answer = parsed.value["answer"]
