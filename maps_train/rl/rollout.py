"""Branch rollouts: G answers to ONE prompt of the trained adapter, each carried on to the end of its question.

GRPO compares G completions of the same prompt. A MAPS question is many calls (a proposer and a consolidator call
per round, N writer calls, the answer), and each call's prompt is built afresh from (question, observations,
state), not continued from the previous call, so an episode is no single token sequence: training on it whole
would condition every call on text the model never saw. Instead, per question of the batch:

1. PILOT: one episode of MAPS with the current policy, decoded as deployed (`rl.decoding: deployed`: greedy,
   under each role's schema). Its calls of the trained roles (the roles whose calls the trained adapter writes:
   `sft_data.adapter_roles`) that can change the outcome (`decisive_calls`: not a consolidator at the last round
   `agent.max_rounds` allows, whose stop decision nothing follows from) are the branch points, and one is drawn
   uniformly (seeded by rl.seed, the global step and the question id), so every round of the role is trained in
   turn.
2. BRANCHES: G episodes of the same question (ids `<id>~g<g>`, so the backends tell them apart by
   `ChatRequest.question_id`). Every call before the branch point is REPLAYED from the pilot (its completion
   returned as it was; the request must equal the pilot's, else a one-line error), so the G branches reach the
   identical state; the branch call is sampled afresh in each (`rl.temperature`, its own seed from the branch id,
   under the role's schema where the deployed route enforces one: `PolicyBackend.explore`), and every later call
   runs as deployed: the environment's roles on their engines, the trained roles' later calls greedy under their
   schema on the policy. A branch's reward is then a function of its branch call alone: two branches that
   sampled the same branch call get the same episode, and the advantage is the decision's, not later sampling
   luck's (`rl.decoding: free` samples every policy call at rl.temperature without a schema, as before).
3. The GRPO sample of branch g is the branch call only: the prompt ids the policy saw, the ids it generated and
   their log-probabilities (`PolicyBackend.samples`). Its reward is the outcome of the branch's whole episode.
   Retrieved passages, other roles' outputs and replayed text are never completion tokens. Later calls of the
   trained roles in a branch are the policy's too, but decoded greedily: they are no samples of the policy at
   rl.temperature, so GRPO's ratio has nothing to say about them, and their credit is not this sample's. They
   are trained when a later step's draw makes them the branch point. One sample per group is the price of
   credit that belongs to one decision; under free decoding every later call added its own sampling noise to the
   branch's reward (the free-decoding writer run of docs/learning-study.md).

Seeds: each step's episodes run with `agent.sampling.seed` set to a seed of (rl.seed, step), so every request
gets its own seed from (that seed, question id, role, call index) (`agents.engine.request_seed`): a rerun of a
step (a resume) samples the same episodes.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maps_train.adapters import AdapterSet, rl_source_set
from maps_train.agents.engine import request_seed
from maps_train.agents.registry import engine_class
from maps_train.errors import MapsTrainError
from maps_train.llm.budget import ReasoningCap
from maps_train.llm.router import Router, engine_key, make_backend
from maps_train.llm.types import ChatRequest, Completion
from maps_train.questions import Question
from maps_train.recipe import Recipe, RoleRoute, route_for
from maps_train.records.trace import TraceRecord
from maps_train.retrieval.base import Hit, Retriever
from maps_train.rl.layout import RoleRun
from maps_train.rl.policy import PolicyBackend, PolicySample
from maps_train.rl.rank_credit import grade_branch_search

PILOT = "pilot"


def trained_trace_roles(recipe: Recipe, role: str, source: AdapterSet | None = None) -> list[str]:
    """`RoleRun.trained_roles` of `role`'s run, its adapter read from `source` (default: RL's starting set,
    `adapters.rl_source_set`): the trace roles the policy answers."""
    return RoleRun.of(recipe, role).trained_roles(source if source is not None else rl_source_set(recipe))


def policy_routes(recipe: Recipe, trained_roles: Sequence[str], policy_name: str) -> dict[str, RoleRoute]:
    """The recipe's routes with the trained roles' sent to the policy (their thinking switch, sampling and schema
    kept under `rl.decoding: deployed`; no schema under "free"): what an RL episode starts engines for
    (`maps-train plan` sizes the same)."""
    routes = dict(recipe.roles)
    for role in trained_roles:
        route = route_for(recipe.roles, role)
        routes[role] = dataclasses.replace(route, backend="hf", model=f"rl-policy:{policy_name}", adapter=None,
                                           structured=route.structured and recipe.rl.decoding == "deployed")
    return routes


def policy_router(recipe: Recipe, trained_roles: Sequence[str], policy: PolicyBackend,
                  backends: Mapping[str, Any] | None = None) -> Router:
    """The recipe's router with the trained roles' routes served by `policy` (`policy_routes`). `backends`: ready
    environment backends by engine key or kind (tests)."""
    routes = policy_routes(recipe, trained_roles, policy.name)
    given = {**(backends or {}), engine_key(routes[trained_roles[0]]): policy}
    return Router(routes, backends=given, reasoning_cap=ReasoningCap.from_config(recipe.backend),
                  factory=lambda kind, model, shared: make_backend(kind, model, shared, recipe.backend))


@dataclass
class LoggedCall:
    request: ChatRequest
    completion: Completion


class CallLog:
    """A backend that passes every request on and keeps (request, completion) per question id, in call order."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls: dict[str, list[LoggedCall]] = defaultdict(list)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        completions = self.inner.generate(requests)
        for request, completion in zip(requests, completions):
            self.calls[request.question_id or ""].append(LoggedCall(request, completion))
        return completions


class ReplayBackend:
    """A backend that answers each episode's first calls from a recorded prefix and sends the rest to `live`.

    `prefixes`: episode (question id) -> the calls to replay, in order. A replayed request must be the recorded
    one (role and messages): the episode is then in the recorded state, call for call."""

    def __init__(self, live: Any, prefixes: Mapping[str, list[LoggedCall]]):
        self.live = live
        self.prefixes = prefixes
        self.replayed: dict[str, int] = defaultdict(int)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        results: list[Completion | None] = [None] * len(requests)
        live_rows = []
        for row, request in enumerate(requests):
            episode = request.question_id or ""
            prefix = self.prefixes.get(episode, [])
            position = self.replayed[episode]
            if position >= len(prefix):
                live_rows.append(row)
                continue
            recorded = prefix[position]
            if recorded.request.role != request.role or recorded.request.messages != request.messages:
                raise MapsTrainError(
                    f"rl rollout: episode '{episode}' call {position} ({request.role}) is not the pilot's "
                    f"({recorded.request.role}, same messages: {recorded.request.messages == request.messages}); "
                    "every earlier call was replayed, so the retriever answered the same queries differently")
            results[row] = dataclasses.replace(recorded.completion)
            self.replayed[episode] += 1
        if live_rows:
            for row, completion in zip(live_rows, self.live.generate([requests[i] for i in live_rows])):
                results[row] = completion
        return results  # type: ignore[return-value]


class HitLog:
    """A retriever that remembers every passage it returned (id -> hit), so the evidence reward can match gold
    passages known only by title and text against what a rollout retrieved (traces keep passage ids only)."""

    def __init__(self, inner: Retriever):
        self.inner = inner
        self.passages: dict[str, Hit] = {}

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results = self.inner.search(queries, k)
        for hits in results:
            self.passages.update((hit.id, hit) for hit in hits)
        return results


@dataclass
class Rollout:
    """One GRPO sample: branch `branch` of a question, the trained call it samples, and its whole episode."""

    question: Question  # the branch's question (id `<id>~g<g>`), as the trace names it
    source_id: str  # the question's own id
    branch: int
    branch_call: int  # b: which of the pilot's trained-role calls the branches sample afresh
    sample: PolicySample
    trace: TraceRecord


def step_seed(seed: int, step: int) -> int:
    """The base request seed of one training step's episodes."""
    return request_seed(seed, step, "rl-step", "", 0)


def branch_index(seed: int, step: int, question_id: str, calls: int) -> int:
    """b, drawn uniformly from 0..calls-1 (seeded by rl.seed, the step and the question)."""
    return random.Random(request_seed(seed, step, question_id, "rl-branch", calls)).randrange(calls)


def decisive_calls(calls: Sequence[LoggedCall], trained_roles: set[str], max_rounds: int,
                   min_rounds: int = 1) -> list[int]:
    """The positions in `calls` (one episode's, in call order) of the trained roles' calls that can change the
    outcome, the branch points: every proposer, writer and answer call (what they write decides the passages
    found or the answer), and a consolidator call only from round `agent.min_rounds` to the one before the last
    round `agent.max_rounds` allows, where its stop-or-continue decides whether another round is searched. Before
    min_rounds the search goes on, and at the last round it stops, whatever it says: its credit (right
    stop-or-continue) would reward a decision nothing follows from."""
    positions, consolidations = [], 0
    for i, call in enumerate(calls):
        if call.request.role == "consolidator":
            consolidations += 1
            if not min_rounds <= consolidations < max_rounds:
                continue
        if call.request.role in trained_roles:
            positions.append(i)
    return positions


def branch_id(question_id: str, branch: int | str) -> str:
    return f"{question_id}~{PILOT if branch == PILOT else f'g{branch}'}"


class BranchRollouts:
    """Pilot and branch episodes of MAPS for a batch of questions (see the module docstring)."""

    def __init__(self, recipe: Recipe, router: Any, policy: PolicyBackend, retriever: Retriever,
                 trained_roles: Sequence[str], num_generations: int, seed: int, rank_depth: int | None = None):
        if recipe.agent.method != "maps":
            raise MapsTrainError(f"agent.method: rl trains MAPS roles; got '{recipe.agent.method}'")
        self.recipe = recipe
        self.router = router
        self.policy = policy
        self.retriever = retriever
        self.trained_roles = set(trained_roles)
        self.num_generations = num_generations
        self.seed = seed
        self.rank_depth = rank_depth  # rl.reward.process_depth: grade a branch search call's find by rank

    def engine(self, backend: Any, step: int):
        """A MAPS engine over `backend` whose requests are seeded for training step `step`."""
        sampling = dataclasses.replace(self.recipe.agent.sampling, seed=step_seed(self.seed, step), sample=0)
        recipe = dataclasses.replace(self.recipe, agent=dataclasses.replace(self.recipe.agent, sampling=sampling))
        return engine_class(recipe.agent.method)(recipe, backend, self.retriever)

    def run(self, questions: list[Question], step: int) -> list[Rollout]:
        """G rollouts per question, question after question (branch 0..G-1 each): TRL's group order."""
        if len({q.id for q in questions}) != len(questions):
            raise MapsTrainError("rl rollout: a question twice in one batch (its episodes would share ids)")
        self.policy.samples.clear()
        self.policy.explore = set()  # the pilot: every call as the policy decodes it outside a branch call
        self.policy.fixed_decisions = {}
        pilots = CallLog(self.router)
        self.engine(pilots, step).run_batch([dataclasses.replace(q, id=branch_id(q.id, PILOT)) for q in questions])
        prefixes: dict[str, list[LoggedCall]] = {}
        branch_calls: dict[str, int] = {}
        for question in questions:
            calls = pilots.calls[branch_id(question.id, PILOT)]
            decisive = decisive_calls(calls, self.trained_roles, self.recipe.agent.max_rounds,
                                      self.recipe.agent.min_rounds)
            if not decisive:
                raise MapsTrainError(f"rl rollout: question '{question.id}': the pilot made no call of "
                                     f"{', '.join(sorted(self.trained_roles))} that can change its outcome")
            point = decisive[branch_index(self.seed, step, question.id, len(decisive))]
            # b counts the trained roles' calls before the branch point (the rewards find the b-th in the trace).
            branch_calls[question.id] = sum(call.request.role in self.trained_roles for call in calls[:point])
            for g in range(self.num_generations):
                prefixes[branch_id(question.id, g)] = calls[:point]
        branches = [dataclasses.replace(q, id=branch_id(q.id, g)) for q in questions for g in range(self.num_generations)]
        self.policy.explore = {branch.id for branch in branches}  # each branch's first live call is sampled
        if self.recipe.rl.decisions == "both":  # a decision branch call: stop in even branches, go on in odd ones
            self.policy.fixed_decisions = {branch_id(q.id, g): g % 2 == 0 for q in questions
                                           for g in range(self.num_generations)}
        traces = self.engine(ReplayBackend(self.router, prefixes), step).run_batch(branches)
        return [self._rollout(branch, trace, branch_calls, i) for i, (branch, trace) in
                enumerate(zip(branches, traces))]

    def _rollout(self, branch: Question, trace: TraceRecord, branch_calls: dict[str, int], index: int) -> Rollout:
        source_id = branch.id.rsplit("~", 1)[0]
        samples = self.policy.samples_of(branch.id)
        # Everything before the branch call was replayed, so the policy's first call of this episode is it.
        if not samples or samples[0].role not in self.trained_roles or not samples[0].sampled:
            raise MapsTrainError(f"rl rollout: episode '{branch.id}' made no sampled live call of the trained roles")
        if self.rank_depth is not None:
            grade_branch_search(trace, branch, sorted(self.trained_roles), branch_calls[source_id], self.retriever,
                                self.rank_depth)
        return Rollout(branch, source_id, index % self.num_generations, branch_calls[source_id], samples[0], trace)
