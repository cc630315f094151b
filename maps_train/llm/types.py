"""Requests and results of the batched chat interface."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


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
    # spliced tool results included), continued as the Search-o1 original does with a prompt string. Unlike
    # `continue_final_message`, the chat template sees only `messages`, so a turn can be resumed inside a Qwen3
    # thinking block. Write the turn with its own `<think>`: where the template already opened one (Qwen3.6,
    # QwQ), the backend drops the duplicate. Exclusive with `continue_final_message`.
    raw_continuation: str | None = None


@dataclass
class Completion:
    text: str
    reasoning: str | None = None  # Qwen3 thinking, when the model thought
    prompt_tokens: int = 0
    completion_tokens: int = 0  # every generated token, the reasoning's included
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking (up to and including `</think>`)
    latency_s: float = 0.0
    model: str = ""
    adapter: str | None = None
    finish_reason: str | None = None  # "stop", "length", ...
    role: str = ""
    constrained: bool = False  # True when a JSON schema constrained decoding (vllm, openai; never hf)
    # The sampling the backend actually used (route merged with the request's overrides), for the trace.
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Backend(Protocol):
    """Anything that turns a batch of chat requests into completions, in order."""

    def generate(self, requests: list[ChatRequest]) -> list[Completion]: ...

