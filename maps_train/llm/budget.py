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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from maps_train.llm.common import prompt_opens_thinking
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import RoleRoute

# The stop-thinking instruction of the Qwen3 Technical Report (section 4.3), closing the capped reasoning.
REASONING_CAP_CLOSE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now."
    "\n</think>\n\n"
)
_THINK_OPEN = "<think>\n"


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
        """`backend.generate(requests, routes)`, with every reasoning-capped completion marked and (policy
        "answer") answered by ONE batched follow-up call for all of them."""
        completions = backend.generate(requests, routes)
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
            shrink=None,
        )


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
        finish_reason=answer.finish_reason,
        constrained=answer.constrained,
        reasoning_capped=True,
    )
