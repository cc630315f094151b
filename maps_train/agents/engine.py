"""What every method's engine shares: per-question bookkeeping, one batched backend call per role per step, one
batched search per step, and turning a finished question into a `TraceRecord`.

An engine advances a batch of questions together. Each step it builds one `PendingCall` per pending call (for all
active questions), sends them with ONE `backend.generate`, and parses every completion with the plan's parser,
which always yields a usable value (counted as a parse failure when it took a fallback). Every request carries
`agent.sampling` (temperature, top_p, and with a base seed a seed of its own: see `request_seed`), which the
backend merges over the role's route, and each call's trace usage records the sampling it ran with. Baselines subclass
`Engine`, register with `maps_train.agents.registry.register_method`, and reuse these helpers.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from maps_train.agents.jsonparse import Parsed
from maps_train.agents.prompting import PromptLibrary
from maps_train.config.yaml_io import to_dict
from maps_train.errors import MapsTrainError
from maps_train.llm.types import Backend, ChatRequest, Completion, PromptShrinker
from maps_train.questions import Question
from maps_train.recipe import Recipe, SamplingConfig
from maps_train.records.answer import Cost
from maps_train.records.credit import compute_credit
from maps_train.records.evidence import GoldPassage, gold_evidence, needs_passage_text
from maps_train.records.trace import CallUsage, RoleCall, RoundRecord, TraceRecord
from maps_train.retrieval.base import Hit, Retriever


@dataclass
class QuestionRun:
    """One question's progress: rounds so far, cost, parse failures, and (once done) the answer."""

    question: Question
    cost: Cost = field(default_factory=Cost)
    rounds: list[RoundRecord] = field(default_factory=list)
    parse_failures: Counter = field(default_factory=Counter)
    final_call: RoleCall | None = None
    final_answer: str = ""
    stop_reason: str = ""
    calls_made: Counter = field(default_factory=Counter)  # role -> requests sent so far (the seed's call index)
    # Batched searches this question took part in: one per `Engine.search` call that held at least one of its
    # queries. The one stop-round count every method shares (a method's own `rounds` counts its turns).
    retrieval_rounds: int = 0
    # The retrieved passages by id, kept only when a gold passage is known by title and text alone (the trace keeps
    # ids): the credit matches them when the trace is written.
    passages: dict[str, Hit] = field(default_factory=dict)
    _gold: list[GoldPassage] | None = field(default=None, repr=False)

    @property
    def gold(self) -> list[GoldPassage]:
        """The question's gold passages (`records.evidence.gold_evidence`), read once."""
        if self._gold is None:
            self._gold = gold_evidence(self.question.metadata)
        return self._gold

    def saw(self, hits: list[Hit]) -> None:
        """Remember `hits` where the credit will need their text."""
        if needs_passage_text(self.gold):
            self.passages.update((hit.id, hit) for hit in hits)

    @property
    def current(self) -> RoundRecord:
        return self.rounds[-1]

    def start_round(self) -> RoundRecord:
        self.rounds.append(RoundRecord(index=len(self.rounds) + 1))
        return self.rounds[-1]

    def to_trace(self, method: str, config_digest: str) -> TraceRecord:
        trace = TraceRecord(
            question_id=self.question.id,
            question=self.question.question,
            dataset=self.question.dataset,
            method=method,
            config_digest=config_digest,
            rounds=self.rounds,
            stop_reason=self.stop_reason,
            final_call=self.final_call,
            final_answer=self.final_answer,
            golden_answers=list(self.question.golden_answers),
            options=list(self.question.options) if self.question.options else None,
            parse_failures=dict(self.parse_failures),
            cost=self.cost.rounded(),
            retrieval_rounds=self.retrieval_rounds,
        )
        trace.credit = compute_credit(trace, self.gold, self.passages)
        return trace


@dataclass
class PendingCall:
    """One pending model call: who asks, the rendered messages, how to parse the reply."""

    run: QuestionRun
    role: str
    messages: list[dict[str, str]]
    parse: Callable[[str], Parsed]  # must never raise; returns the fallback value on bad text
    json_schema: dict[str, Any] | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    # Smaller versions of `messages` for a backend whose context they do not fit (see `PromptShrinker`).
    shrink: PromptShrinker | None = None
    # A privileged hint inside `messages` (agent.hint), recorded on the call so sft-data can train without it.
    hint: str | None = None


def config_digest(recipe: Recipe, prompt_digests: dict[str, str]) -> str:
    """A short hash of everything that changes a method's outputs (not batch sizes, URLs or concurrency)."""
    agent = to_dict(recipe.agent)
    for key in ("batch_size", "schedule", "concurrency"):  # how questions are scheduled, not what they say
        agent.pop(key, None)
    agent.pop("prompts_dir", None)  # the prompt texts themselves are hashed instead
    if recipe.agent.sampling == SamplingConfig():
        agent.pop("sampling", None)  # unset: the digest stays what it was before the section existed (resumes)
    if recipe.agent.hint == "none":
        agent.pop("hint", None)  # likewise
    if not recipe.agent.search_question:
        agent.pop("search_question", None)  # likewise
    retrieval = to_dict(recipe.retrieval)
    relevant = {
        "agent": agent,
        "roles": to_dict(recipe.roles),
        "retrieval": {k: retrieval[k] for k in ("corpus", "kind", "encoder", "index_type", "nprobe")},
        "backend": {k: getattr(recipe.backend, k) for k in ("dtype", "max_model_len", "truncate_prompt")},
        "prompts": prompt_digests,
    }
    blob = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def request_seed(base: int, sample: int, question_id: str, role: str, index: int) -> int:
    """The seed of one request: a hash of (base seed, sample, question id, role, call index of that role within
    the question). Distinct across samples and calls; the same on a rerun whatever the batch size, the questions
    around it or a resume. 31 bits, which every backend takes (vLLM, the OpenAI API, torch)."""
    blob = json.dumps([base, sample, question_id, role, index])
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:4], "big") & 0x7FFFFFFF


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def usage_of(completion: Completion, request: ChatRequest | None = None) -> CallUsage:
    """A call's usage; the sampling is what the backend reports it ran, else what the request asked for."""
    asked = request or ChatRequest(role="", messages=[])
    capped = bool(getattr(completion, "reasoning_capped", False))
    return CallUsage(
        prompt_tokens=int(completion.prompt_tokens or 0),
        completion_tokens=int(completion.completion_tokens or 0),
        reasoning_tokens=int(completion.reasoning_tokens or 0),
        latency_s=round(float(completion.latency_s or 0.0), 4),
        model=completion.model or "",
        adapter=completion.adapter,
        finish_reason=completion.finish_reason,
        constrained=bool(getattr(completion, "constrained", False)),
        temperature=_first(getattr(completion, "temperature", None), asked.temperature),
        top_p=_first(getattr(completion, "top_p", None), asked.top_p),
        seed=_first(getattr(completion, "seed", None), asked.seed),
        prompt_tokens_dropped=int(getattr(completion, "prompt_tokens_dropped", 0) or 0),
        reasoning_capped=capped,
        length_capped=capped or completion.finish_reason == "length",
        stops_in_reasoning=int(getattr(completion, "stops_in_reasoning", 0) or 0),
    )


def seen_messages(plan: PendingCall, completion: Completion) -> list[dict[str, str]]:
    """The messages the model saw: the plan's, or the smaller ones the backend sent when they did not fit its
    context (so a trace, and the SFT rows made from it, hold what the model answered). A partial assistant turn
    sent raw (the baselines' `RawTurnBackend`) comes back as `fitted_continuation` and is the last message again."""
    fitted = getattr(completion, "fitted_messages", None)
    if fitted is None:
        return plan.messages
    continuation = getattr(completion, "fitted_continuation", None)
    if continuation is not None and plan.messages and plan.messages[-1].get("role") == "assistant":
        return [*fitted, {**plan.messages[-1], "content": continuation}]
    return fitted


class Engine:
    """Base of every method: subclasses implement `run_batch` and name the prompts they use."""

    method: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()  # the routes its calls take (departures compares them)

    def __init__(self, recipe: Recipe, backend: Backend, retriever: Retriever, prompts: PromptLibrary | None = None):
        self.recipe = recipe
        self.agent = recipe.agent
        self.backend = backend
        self.retriever = retriever
        self.prompts = prompts or PromptLibrary(recipe.agent.prompts_dir)
        # Step counters, for tests and benchmarks: how many batched calls the engine made.
        self.generate_calls = 0
        self.search_calls = 0
        # Called before each batched step with a short description ("proposer x12"); the runner shows it on its
        # progress bar, so a long batch is not silent until its questions finish.
        self.on_step: Callable[[str], None] | None = None

    # -- what a method defines -------------------------------------------------------------------------------
    def prompt_names(self) -> list[str]:
        """The prompt files this configuration uses (hashed into the config digest)."""
        return []

    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        raise NotImplementedError

    # -- shared machinery ------------------------------------------------------------------------------------
    @property
    def config_digest(self) -> str:
        if not hasattr(self, "_digest"):
            digests = {name: self.prompts.get(name).digest for name in self.prompt_names()}
            self._digest = config_digest(self.recipe, digests)
        return self._digest

    def request_of(self, plan: PendingCall) -> ChatRequest:
        """The plan as a request, with `agent.sampling` on it: its temperature and top_p, and (with a base seed)
        a seed of its own derived from the question, the role and how many calls of that role came before."""
        sampling = self.agent.sampling
        run = plan.run
        index = run.calls_made[plan.role]
        run.calls_made[plan.role] += 1
        seed = None
        if sampling.seed is not None:
            seed = request_seed(sampling.seed, sampling.sample, run.question.id, plan.role, index)
        return ChatRequest(
            role=plan.role,
            messages=plan.messages,
            json_schema=plan.json_schema,
            question_id=run.question.id,
            max_tokens=plan.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=seed,
            stop=plan.stop,
            shrink=plan.shrink,
        )

    def call_roles(self, plans: list[PendingCall]) -> list[tuple[RoleCall, Parsed]]:
        """All `plans` in ONE backend call; each reply recorded on its question (trace call, cost, failures)."""
        if not plans:
            return []
        requests = [self.request_of(plan) for plan in plans]
        self.generate_calls += 1
        if self.on_step is not None:
            self.on_step(f"{'/'.join(dict.fromkeys(plan.role for plan in plans))} x{len(plans)}")
        completions = self.backend.generate(requests)
        if len(completions) != len(requests):
            raise MapsTrainError(f"backend returned {len(completions)} completions for {len(requests)} requests")
        results = []
        longest: dict[tuple[int, str], tuple[QuestionRun, float]] = {}
        for plan, request, completion in zip(plans, requests, completions):
            key = (id(plan.run), plan.role)
            latency = float(completion.latency_s or 0.0)
            if key not in longest or latency > longest[key][1]:
                longest[key] = (plan.run, latency)
            text = completion.text or ""
            parsed = plan.parse(text)
            usage = usage_of(completion, request)
            call = RoleCall(
                role=plan.role,
                messages=seen_messages(plan, completion),
                raw_text=text,
                parsed=parsed.value,
                parse_ok=parsed.ok,
                usage=usage,
                reasoning=completion.reasoning,
                parse_error=parsed.error,
                generated=completion.generated,
                hint=plan.hint,
            )
            plan.run.cost.add_completion(plan.role, completion.prompt_tokens, completion.completion_tokens,
                                         completion.reasoning_tokens)
            if usage.prompt_tokens_dropped:
                plan.run.cost.add_dropped(plan.role, usage.prompt_tokens_dropped)
            if usage.length_capped:
                plan.run.cost.add_caps(plan.role, usage.reasoning_capped, usage.length_capped)
            if usage.stops_in_reasoning:
                plan.run.cost.add_stops_in_reasoning(plan.role, usage.stops_in_reasoning)
            if not parsed.ok:
                plan.run.parse_failures[plan.role] += 1
            results.append((call, parsed))
        for (_, role), (run, latency) in longest.items():
            run.cost.add_latency(role, latency)
        return results

    def search(self, requests: list[tuple[QuestionRun, str]], k: int) -> list[list[Hit]]:
        """All sub-queries of a step (of every question) in ONE retriever call; cost booked per question.

        Identical query strings are searched once and share the result.
        """
        if not requests:
            return []
        unique = list(dict.fromkeys(query for _, query in requests))
        self.search_calls += 1
        if self.on_step is not None:
            self.on_step(f"search x{len(unique)}")
        start = time.perf_counter()
        results = self.retriever.search(unique, k)
        elapsed = time.perf_counter() - start
        if len(results) != len(unique):
            raise MapsTrainError(f"retriever returned {len(results)} result lists for {len(unique)} queries")
        by_query = dict(zip(unique, results))
        share = elapsed / len(requests)
        for run in {id(run): run for run, _ in requests}.values():
            run.retrieval_rounds += 1
        hit_lists = []
        for run, query in requests:
            hits = list(by_query[query])[:k]
            run.saw(hits)
            run.cost.add_search(1, len(hits), share)
            hit_lists.append(hits)
        return hit_lists
