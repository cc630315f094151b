"""A request merged with its role's route: the `CallSpec` every backend runs (sampling from the request, the
rest from the route), and where a generation stops at one of the request's stop strings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maps_train.llm.types import ChatRequest
from maps_train.recipe import RoleRoute


@dataclass
class CallSpec:
    """One request as a backend runs it: the route's sampling with the request's overrides applied.

    Sampling travels on the request (temperature, top_p, seed), not on the route, so one engine serves greedy
    evaluation and sampled teacher runs alike and each request can carry its own seed. top_k, min_p and the
    penalties are the route's, sent to every backend in full (see `RoleRoute`)."""

    request: ChatRequest
    route: RoleRoute
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] | None
    seed: int | None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    json_schema: dict[str, Any] | None = None  # only when the route asks for structured output
    # The route's, resolved to the value every backend is sent (0: no top-k; 0; 0; 1: no penalty).
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def adapter(self) -> str | None:
        return self.route.adapter

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def sampling_key(self) -> tuple:
        """Requests with equal keys can share one `generate` call of a backend with per-call sampling (HF).

        Greedy decoding ignores top_p, top_k, min_p and the seed (not the penalties), so greedy rows share a key
        whatever those say."""
        penalties = (self.presence_penalty, self.repetition_penalty)
        if self.greedy:
            return (self.max_tokens, 0.0, tuple(self.stop or ()), *penalties)
        return (self.max_tokens, self.temperature, self.top_p, tuple(self.stop or ()), self.seed, self.top_k,
                self.min_p, *penalties)

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
        top_k=max(0, route.top_k or 0),
        min_p=route.min_p or 0.0,
        presence_penalty=route.presence_penalty or 0.0,
        repetition_penalty=1.0 if route.repetition_penalty is None else route.repetition_penalty,
    )


def default_route(model: str = "", adapter: str | None = None) -> RoleRoute:
    """The route a backend uses when called directly (without a router): base model, greedy, no thinking."""
    return RoleRoute(model=model, adapter=adapter)


def first_stop(text: str, stop: list[str] | None) -> tuple[str, str | None]:
    """Text up to the first stop string (excluded, as vLLM does), and that stop string (None when none is in it;
    of two starting at the same place, the longer)."""
    found = [(text.find(s), -len(s), s) for s in stop or () if s and s in text]
    if not found:
        return text, None
    at, _, string = min(found)
    return text[:at], string
