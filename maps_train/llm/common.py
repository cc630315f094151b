"""What every backend shares: a request merged with its role's route, prompt rendering and fitting, and
splitting Qwen3 thinking out of the generated text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.types import ChatRequest
from maps_train.recipe import RoleRoute

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


@dataclass
class CallSpec:
    """One request as a backend runs it: the route's sampling with the request's overrides applied.

    Sampling travels on the request (temperature, top_p, seed), not on the route, so one engine serves greedy
    evaluation and sampled teacher runs alike and each request can carry its own seed."""

    request: ChatRequest
    route: RoleRoute
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] | None
    seed: int | None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    json_schema: dict[str, Any] | None = None  # only when the route asks for structured output

    @property
    def adapter(self) -> str | None:
        return self.route.adapter

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def sampling_key(self) -> tuple:
        """Requests with equal keys can share one `generate` call of a backend with per-call sampling (HF).

        Greedy decoding ignores top_p and the seed, so greedy rows share a key whatever those say."""
        if self.greedy:
            return (self.max_tokens, 0.0, tuple(self.stop or ()))
        return (self.max_tokens, self.temperature, self.top_p, tuple(self.stop or ()), self.seed)

    def sampling_used(self) -> dict[str, Any]:
        """The sampling fields a `Completion` reports (what the backend ran, not what the route said)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}


def _override(value: Any, default: Any) -> Any:
    """A request's field wins over the route's unless it is None (0 and 0.0 are real values)."""
    return value if value is not None else default


def call_spec(request: ChatRequest, route: RoleRoute) -> CallSpec:
    kwargs = {"enable_thinking": route.enable_thinking}
    kwargs.update(request.chat_template_kwargs or {})
    return CallSpec(
        request=request,
        route=route,
        max_tokens=_override(request.max_tokens, route.max_tokens),
        temperature=_override(request.temperature, route.temperature),
        top_p=_override(request.top_p, route.top_p),
        stop=request.stop,
        seed=_override(request.seed, route.seed),
        chat_template_kwargs=kwargs,
        json_schema=request.json_schema if route.structured else None,
    )


def default_route(model: str = "", adapter: str | None = None) -> RoleRoute:
    """The route a backend uses when called directly (without a router): base model, greedy, no thinking."""
    return RoleRoute(model=model, adapter=adapter)


def render_prompt(tokenizer: Any, spec: CallSpec) -> str:
    """The chat template applied the way vLLM's chat entry point does it (text, then tokenised without
    special tokens), so HF and vLLM see the same prompt tokens for the same request."""
    cont = spec.request.continue_final_message
    return tokenizer.apply_chat_template(
        spec.request.messages,
        tokenize=False,
        add_generation_prompt=not cont,
        continue_final_message=cont,
        **spec.chat_template_kwargs,
    )


def prompt_token_ids(tokenizer: Any, spec: CallSpec) -> list[int]:
    text = render_prompt(tokenizer, spec)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_prompt(ids: list[int], spec: CallSpec, max_model_len: int, policy: str) -> list[int]:
    """Make room for `max_tokens` of output within the context.

    policy "error": a one-line MapsTrainError; "left": keep only the newest tokens of the prompt (the oldest,
    usually the system prompt and early context, are dropped; the output may degrade but the call goes through).
    """
    room = max_model_len - spec.max_tokens
    if room <= 0:
        raise MapsTrainError(
            f"roles.{spec.request.role}.max_tokens: {spec.max_tokens} leaves no room for a prompt within "
            f"backend.max_model_len={max_model_len}"
        )
    if len(ids) <= room:
        return ids
    if policy == "left":
        return ids[len(ids) - room :]
    raise MapsTrainError(
        f"backend.truncate_prompt=error: prompt of role '{spec.request.role}' (question "
        f"{spec.request.question_id}) has {len(ids)} tokens, over max_model_len {max_model_len} minus max_tokens "
        f"{spec.max_tokens}"
    )


def split_thinking(text: str) -> tuple[str, str | None]:
    """(answer, reasoning): Qwen3 writes `<think>...</think>` before its answer.

    The opening tag may be in the prompt (the template opens it), so a lone `</think>` also ends reasoning; an
    unclosed `<think>` (output cut at max_tokens) is all reasoning and no answer.
    """
    if _THINK_CLOSE in text:
        head, _, tail = text.partition(_THINK_CLOSE)
        reasoning = head.split(_THINK_OPEN, 1)[-1].strip()
        return tail.strip(), reasoning
    stripped = text.lstrip()
    if stripped.startswith(_THINK_OPEN):
        return "", stripped[len(_THINK_OPEN) :].strip()
    return text, None


def cut_at_stop(text: str, stop: list[str] | None) -> tuple[str, bool]:
    """Text up to the first stop string (excluded, as vLLM does), and whether one was found."""
    if not stop:
        return text, False
    cuts = [text.find(s) for s in stop if s and s in text]
    if not cuts:
        return text, False
    return text[: min(cuts)], True


def adapter_dir(path: str, role: str) -> Path:
    """A LoRA adapter folder, checked; the error names the route field."""
    folder = Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise MapsTrainError(
            f"roles.{role}.adapter: '{path}' is not a LoRA adapter folder (no adapter_config.json there)"
        )
    return folder


def adapter_name(path: str) -> str:
    """A stable, module-safe name for an adapter folder (PEFT adapter names become module keys: no dots)."""
    base = Path(path.rstrip("/")).name or "adapter"
    return re.sub(r"\W", "_", base)
