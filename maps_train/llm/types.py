"""Requests and results of the batched chat interface."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PromptShrinker(Protocol):
    """Smaller versions of one request's prompt, for a backend whose context it does not fit: step 0 is the
    request as built, each further step drops one more of the pieces least needed (the oldest observation, the
    lowest-ranked passage, ...), so tokens never grow with the step. The backend, which owns the tokenizer, picks
    the smallest step that fits (see `maps_train.llm.prompt_fit.fit_request`)."""

    steps: int  # the largest step

    def apply(self, request: ChatRequest, step: int) -> ChatRequest: ...


@dataclass
class ChatRequest:
    role: str  # the agent role making the call; the router picks backend, model and adapter from it
    messages: list[dict[str, str]]
    json_schema: dict[str, Any] | None = None  # constrain the output where the route allows it
    question_id: str | None = None  # for the cost ledger
    # Per-request overrides of the route's sampling (None: the route's value).
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None  # sampled rows with a seed are reproducible: same seed, same request, same text
    stop: list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # merged over the route's (e.g. enable_thinking)
    continue_final_message: bool = False  # the last message is a partial assistant turn to continue
    # Raw text appended after the rendered generation prompt: the model's own partial turn (its reasoning and any
    # spliced tool results included), continued as the tool-using baselines' originals do with a prompt string.
    # Unlike `continue_final_message`, the chat template sees only `messages`, so it cannot rewrite the turn
    # (Qwen3's drops what lies between two reasoning blocks) and a turn can be resumed inside a thinking block.
    # Write the turn with its own `<think>`: where the template already opened one (Qwen3.6, QwQ), the backend
    # drops the duplicate. Exclusive with `continue_final_message`.
    raw_continuation: str | None = None
    # How to make the prompt smaller when it does not fit the context (None: only the generic fallbacks).
    shrink: PromptShrinker | None = field(default=None, repr=False, compare=False)


@dataclass
class Completion:
    text: str
    reasoning: str | None = None  # Qwen3 thinking, when the model thought
    # Exactly what the model wrote after the prompt, before `text` and `reasoning` were split out of it (think tags
    # and whitespace as generated): what a continued turn must carry on from, byte for byte. None where the
    # backend cannot know it (a chat reply a server's reasoning parser split).
    generated: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # every generated token, the reasoning's included
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking (up to and including `</think>`)
    latency_s: float = 0.0
    model: str = ""
    adapter: str | None = None
    finish_reason: str | None = None  # "stop", "length", ...
    # The stop string that ended generation (finish "stop"); None for an end-of-turn token, the length cap, or a
    # backend that does not say.
    stop_string: str | None = None
    # Stop strings that fired inside unclosed reasoning and were written past (see maps_train.llm.budget): a tag
    # the model restated while thinking is not an action, so generation continued after it.
    stops_in_reasoning: int = 0
    # max_tokens came inside the reasoning (no `</think>`): see maps_train.llm.budget (`backend.reasoning_cap`)
    reasoning_capped: bool = False
    role: str = ""
    constrained: bool = False  # True when a JSON schema constrained decoding (vllm, openai; never hf)
    # The sampling the backend actually used (route merged with the request's overrides), for the trace.
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    # Prompt tokens left out to fit the context (0: the prompt went as built), and then the prompt the model
    # saw instead: its messages and, for a raw continuation, the continued text (None when nothing was left out).
    prompt_tokens_dropped: int = 0
    fitted_messages: list[dict[str, str]] | None = None
    fitted_continuation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Backend(Protocol):
    """Anything that turns a batch of chat requests into completions, in order."""

    def generate(self, requests: list[ChatRequest]) -> list[Completion]: ...

