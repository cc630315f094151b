"""What happens when a call's reasoning runs into `max_tokens`: the one policy every route goes through.

A thinking model cut inside `<think>` leaves no answer at all (no JSON, no `\\boxed{}`), so the question would
score as wrong without anyone seeing why. `backend.reasoning_cap` chooses:

- "answer" (the default): the reasoning is closed and the model answers from it, as the Qwen3 Technical Report
  (section 4.3, "Thinking Budget") does for budgeted thinking: when the thinking reaches the budget, halt it and
  insert the stop-thinking instruction ("Considering the limited time by the user, I have to give the solution
  based on the thinking directly now.\\n</think>.\\n\\n"), after which the model writes its final response from
  the reasoning so far. Here that is a follow-up request continuing the same turn as a raw continuation (the
  reasoning byte for byte, then `REASONING_CAP_CLOSE`), with its own small budget,
  `backend.reasoning_cap_answer_tokens`. The two calls come back as ONE completion: both calls' prompt and
  completion tokens and latency summed, so the question's cost holds what the forced answer really took.
- "none": the capped completion is returned as it is (an empty answer).

Either way the completion is marked `reasoning_capped`, and the trace's usage and the reports count it (beside
calls that hit the length cap at all, `finish_reason == "length"`).

A stop string that fires inside unclosed reasoning is not where the call ends: a thinking model restates the
protocol's own tags while it reasons ("I should write <search> ... </search>"), and a tag inside `<think>` is not an
action. Such a call is continued where it stopped (the stop string put back, as the model wrote it), within what is
left of its `max_tokens`, until a stop string fires after the reasoning, the model ends its turn, or the budget is
spent (then the reasoning cap above applies). The continuations come back as ONE completion (tokens and latency
summed, `stops_in_reasoning` counting them), and the reports count them per system.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from maps_train.llm.prompt_fit import cut_span
from maps_train.llm.thinking import ends_inside_thinking, prompt_opens_thinking, split_thinking
from maps_train.llm.types import ChatRequest, Completion, PromptShrinker
from maps_train.recipe import RoleRoute

# The stop-thinking instruction of the Qwen3 Technical Report (section 4.3), closing the capped reasoning.
REASONING_CAP_CLOSE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now."
    "\n</think>\n\n"
)
_THINK_OPEN = "<think>\n"
# Continuations of one call past stop strings inside its reasoning; a model that keeps restating tags past this
# many ends the call there (its actions are read outside the reasoning, so it took none).
MAX_STOPS_IN_REASONING = 16


def reasoning_capped(completion: Completion) -> bool:
    """The call stopped at `max_tokens` while still thinking: it has reasoning and no answer after it."""
    return completion.finish_reason == "length" and completion.reasoning is not None and not completion.text.strip()


@dataclass(frozen=True)
class ReasoningCap:
    """The policy for calls whose reasoning hit `max_tokens` (see the module docstring)."""

    policy: Literal["answer", "none"] = "answer"
    answer_tokens: int = 512

    @classmethod
    def from_config(cls, config: Any) -> ReasoningCap:
        """From a recipe's `backend` section (defaults where a config predates these fields)."""
        return cls(
            policy=getattr(config, "reasoning_cap", cls.policy),
            answer_tokens=getattr(config, "reasoning_cap_answer_tokens", cls.answer_tokens),
        )

    def generate(self, backend: Any, requests: list[ChatRequest], routes: list[RoleRoute]) -> list[Completion]:
        """`backend.generate(requests, routes)`, continued past stop strings that fired inside the reasoning
        (`continue_past_stops`), with every reasoning-capped completion marked and (policy "answer") answered by ONE
        batched follow-up call for all of them."""
        completions = continue_past_stops(backend, requests, routes, backend.generate(requests, routes))
        capped = [i for i, comp in enumerate(completions) if reasoning_capped(comp)]
        for i in capped:
            completions[i].reasoning_capped = True
        answerable = [i for i in capped if not requests[i].continue_final_message]
        if self.policy != "answer" or not answerable:
            return completions
        follow_ups = [self.follow_up(requests[i], completions[i]) for i in answerable]
        answers = backend.generate(follow_ups, [routes[i] for i in answerable])
        for i, answer in zip(answerable, answers):
            completions[i] = merged(completions[i], answer)
        return completions

    def follow_up(self, request: ChatRequest, capped: Completion) -> ChatRequest:
        """The same turn continued after the capped reasoning and the stop-thinking instruction.

        The turn so far (a raw continuation's text, if the request was one) is followed by exactly what the model
        generated (`Completion.generated`), so the follow-up's prompt is the capped call's prompt plus its output,
        byte for byte. Where the backend could not give the exact text, the reasoning is put back after a `<think>`
        unless the turn already ended inside one (an opener right after a template that opened the block is
        dropped by `join_continuation`)."""
        turn = request.raw_continuation or ""
        if capped.generated is not None:
            written = capped.generated
        else:
            written = ("" if prompt_opens_thinking(turn) else _THINK_OPEN) + (capped.reasoning or "")
        return replace(
            request,
            raw_continuation=f"{turn}{written}{REASONING_CAP_CLOSE}",
            max_tokens=self.answer_tokens,
            shrink=ContinuedShrinker(request, f"{written}{REASONING_CAP_CLOSE}", len(REASONING_CAP_CLOSE)),
        )


def stopped_inside_reasoning(request: ChatRequest, completion: Completion) -> str | None:
    """The stop string that ended `completion` inside its unclosed reasoning, or None (it ended after the
    reasoning, at the end of its turn or at the length cap, or the backend could not give its exact text). A
    backend that does not say which stop string fired is taken at its word when the request had only one."""
    if completion.finish_reason != "stop" or not request.stop or completion.generated is None:
        return None
    if request.continue_final_message:  # continued as a chat message, not raw: it cannot be resumed mid-block
        return None
    stop = completion.stop_string
    if stop is None and len(request.stop) == 1:
        stop = request.stop[0]
    if stop not in request.stop or not ends_inside_thinking(completion.generated, completion.reasoning):
        return None
    return stop


def continue_past_stops(
    backend: Any, requests: list[ChatRequest], routes: list[RoleRoute], completions: list[Completion]
) -> list[Completion]:
    """Every completion whose stop string fired inside its reasoning, continued after that string (ONE batched
    call per round of continuations) until it stops outside the reasoning; see the module docstring."""
    budgets = {
        i: request.max_tokens if request.max_tokens is not None else route.max_tokens
        for i, (request, route) in enumerate(zip(requests, routes))
    }
    pending = set(budgets)
    while pending:
        follow: dict[int, tuple[ChatRequest, str]] = {}
        for i in sorted(pending):
            stop = stopped_inside_reasoning(requests[i], completions[i])
            if stop is None:
                pending.discard(i)
                continue
            completions[i].stops_in_reasoning += 1
            used = completions[i].completion_tokens  # every call of this row so far
            if completions[i].stops_in_reasoning > MAX_STOPS_IN_REASONING or used >= budgets[i]:
                completions[i].finish_reason = "length" if used >= budgets[i] else "stop"
                pending.discard(i)
                continue
            follow[i] = (continued_past(requests[i], completions[i], stop, budgets[i] - used), stop)
        if not follow:
            break
        rows = list(follow)
        more = backend.generate([follow[i][0] for i in rows], [routes[i] for i in rows])
        for i, continued in zip(rows, more):
            completions[i] = joined(completions[i], follow[i][1], continued)
    return completions


def continued_past(request: ChatRequest, stopped: Completion, stop: str, max_tokens: int) -> ChatRequest:
    """`request` (as the agent sent it) continued after `stop`: its turn, all the model generated in this call
    so far (earlier continuations included), the stop string."""
    written = f"{stopped.generated}{stop}"
    turn = request.raw_continuation or ""
    return replace(
        request,
        raw_continuation=f"{turn}{written}",
        max_tokens=max_tokens,
        shrink=ContinuedShrinker(request, written, 0),
    )


def joined(first: Completion, stop: str, more: Completion) -> Completion:
    """One completion for a call and its continuation past a stop string inside the reasoning."""
    generated = f"{first.generated}{stop}{more.generated or ''}"
    head = generated.split("</think>", 1)[0]
    text, reasoning = split_thinking(generated, opened="<think>" not in head)
    return replace(
        more,
        text=text,
        reasoning=reasoning,
        generated=generated,
        prompt_tokens=first.prompt_tokens + more.prompt_tokens,
        completion_tokens=first.completion_tokens + more.completion_tokens,
        reasoning_tokens=first.reasoning_tokens + more.reasoning_tokens,
        latency_s=first.latency_s + more.latency_s,
        prompt_tokens_dropped=first.prompt_tokens_dropped + more.prompt_tokens_dropped,
        fitted_messages=first.fitted_messages,
        fitted_continuation=first.fitted_continuation,
        stops_in_reasoning=first.stops_in_reasoning,
    )


class ContinuedShrinker:
    """A `PromptShrinker` for a request continued past its own output (a follow-up after capped reasoning, a
    continuation past a stop string inside it): the original request's own shrinker first (the agent's: older
    turns before newer ones), then the middle of what was appended, whose last `keep` characters (the
    stop-thinking sentence and `</think>`) always stay. A cut inside the appended text keeps its think blocks as
    they were (`llm.prompt_fit.cut_span`)."""

    CHUNK = 32  # characters of the appended text one step leaves out

    def __init__(self, original: ChatRequest, appended: str, keep: int):
        self.original, self.appended, self.keep = original, appended, keep
        self.inner: PromptShrinker | None = original.shrink
        self.inner_steps = self.inner.steps if self.inner is not None else 0
        self.cuttable = max(0, len(appended) - keep)
        self.steps = self.inner_steps + self.cuttable // self.CHUNK

    def apply(self, request: ChatRequest, step: int) -> ChatRequest:
        base = replace(self.original, max_tokens=request.max_tokens, stop=request.stop)
        inner = min(max(step, 0), self.inner_steps)
        if inner and self.inner is not None:
            base = self.inner.apply(base, inner)
        appended = cut_middle(self.appended, (step - inner) * self.CHUNK, self.keep)
        return replace(request, messages=base.messages, raw_continuation=f"{base.raw_continuation or ''}{appended}",
                       shrink=None)


def cut_middle(text: str, drop: int, keep_tail: int = 0) -> str:
    """`text` without `drop` characters from the middle of its cuttable part (all but the last `keep_tail`), a
    cut mark in their place that keeps every think block as it was (`llm.prompt_fit.cut_span`)."""
    cuttable = len(text) - keep_tail
    drop = min(max(drop, 0), cuttable)
    if drop <= 0:
        return text
    start = (cuttable - drop + 1) // 2
    return cut_span(text, start, start + drop)


def merged(capped: Completion, answer: Completion) -> Completion:
    """One completion for the two calls: the follow-up's answer after the capped reasoning (closed by the
    instruction, as the model saw it), every token and second of both calls, the follow-up's finish reason."""
    both = None if capped.generated is None or answer.generated is None else (
        f"{capped.generated}{REASONING_CAP_CLOSE}{answer.generated}"
    )
    return replace(
        capped,
        text=answer.text,
        generated=both,  # the whole turn the two calls wrote, the inserted instruction included
        reasoning=f"{capped.reasoning}{REASONING_CAP_CLOSE.split('</think>')[0].rstrip()}",
        prompt_tokens=capped.prompt_tokens + answer.prompt_tokens,
        completion_tokens=capped.completion_tokens + answer.completion_tokens,
        reasoning_tokens=capped.reasoning_tokens + answer.reasoning_tokens,
        latency_s=capped.latency_s + answer.latency_s,
        # the follow-up is fitted on its own (through the request's shrinker): its dropped tokens count too
        prompt_tokens_dropped=capped.prompt_tokens_dropped + answer.prompt_tokens_dropped,
        stops_in_reasoning=capped.stops_in_reasoning + answer.stops_in_reasoning,
        finish_reason=answer.finish_reason,
        constrained=answer.constrained,
        reasoning_capped=True,
    )
