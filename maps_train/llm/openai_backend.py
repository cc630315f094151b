"""OpenAI-compatible HTTP backend for `vllm serve` (one or several servers).

Requests run concurrently on a private asyncio loop (bounded by `backend.concurrency` per server), each sent to
the least-loaded of `backend.base_urls`. The adapter is chosen with `model=NAME` (a route's `adapter`, or its
folder name when it is a path: serve adapters as `--lora-modules NAME=PATH`); base-model rows use the server's
base model (found once from `/v1/models`). Each request sends its own `temperature`, `top_p` and, when set, `seed`
(the route's, overridden by the request's). vLLM extras go in `extra_body`: `chat_template_kwargs`,
`structured_outputs={"json": schema}`, and for `truncate_prompt: left` the server's `truncate_prompt_tokens`
(keeps the newest tokens). Timeouts, connection errors, 429 and 5xx are retried with exponential backoff
(`max_retries`, `retry_backoff_s`); then, as on any other refusal, one MapsTrainError line.

The API key comes from `backend.api_key`, or when that is empty from `$OPENAI_API_KEY`, so that recipes (which are
logged and shared) need not hold it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import Counter
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.common import CallSpec, adapter_name, call_spec, default_route, split_thinking
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import BackendConfig, RoleRoute

NO_KEY = "EMPTY"  # what the client sends when no key is set: a vLLM server without --api-key accepts anything


def api_key(config: BackendConfig) -> str:
    """`backend.api_key`, else `$OPENAI_API_KEY`, else a placeholder (the client refuses an empty key)."""
    return config.api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "")


class OpenAIBackend:
    kind = "openai"

    def __init__(self, config: BackendConfig | None = None):
        self.config = config or BackendConfig()
        if not self.config.base_urls:
            raise MapsTrainError("backend.base_urls: empty; give at least one server URL (http://HOST:PORT/v1)")
        self.urls = [u.rstrip("/") for u in self.config.base_urls]
        self.in_flight = Counter({u: 0 for u in self.urls})
        self.served = Counter()  # url -> requests answered there
        self._base_names: dict[str, str] = {}
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-backend", daemon=True)
        self._thread.start()
        self._clients = self._run(self._make_clients())

    # -- event loop plumbing --------------------------------------------------------------------------------

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _make_clients(self):
        from openai import AsyncOpenAI

        self._slots = {u: asyncio.Semaphore(max(1, self.config.concurrency)) for u in self.urls}
        return {
            u: AsyncOpenAI(
                base_url=u, api_key=api_key(self.config), timeout=self.config.request_timeout_s, max_retries=0
            )  # retries are ours: same policy for every error kind
            for u in self.urls
        }

    def _pick_url(self) -> str:
        """Least loaded; ties broken round-robin so an idle fleet still spreads."""
        low = min(self.in_flight[u] for u in self.urls)
        candidates = [u for u in self.urls if self.in_flight[u] == low]
        return candidates[next(self._turn) % len(candidates)]

    async def _with_retries(self, url: str, what: str, call):
        import openai

        retryable = (
            openai.APITimeoutError,
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        )
        attempts = self.config.max_retries + 1
        for attempt in range(attempts):
            try:
                return await call()
            except retryable as err:
                if attempt + 1 == attempts:
                    raise MapsTrainError(
                        f"backend.base_urls: {url} failed {attempts} times ({type(err).__name__}: "
                        f"{_one_line(err)}) on {what}"
                    ) from None
                await asyncio.sleep(self.config.retry_backoff_s * (2**attempt))
            except openai.NotFoundError as err:
                raise MapsTrainError(f"backend.base_urls: {url} has no model for {what} ({_one_line(err)})") from None
            except openai.APIStatusError as err:
                raise MapsTrainError(
                    f"backend.base_urls: {url} refused {what} (HTTP {err.status_code}: {_one_line(err)})"
                ) from None

    async def _base_name(self, url: str) -> str:
        """The server's base model id (the model card without a parent adapter)."""
        if url not in self._base_names:
            page = await self._with_retries(url, "GET /models", lambda: self._clients[url].models.list())
            cards = list(page.data)
            bases = [c.id for c in cards if getattr(c, "parent", None) is None] or [c.id for c in cards]
            if not bases:
                raise MapsTrainError(f"backend.base_urls: {url} serves no model")
            self._base_names[url] = bases[0]
        return self._base_names[url]

    # -- generation -----------------------------------------------------------------------------------------

    def body(self, spec: CallSpec) -> dict[str, Any]:
        extra: dict[str, Any] = {"chat_template_kwargs": spec.chat_template_kwargs}
        if spec.json_schema is not None:
            extra["structured_outputs"] = {"json": spec.json_schema}
        if spec.request.continue_final_message:
            extra.update(continue_final_message=True, add_generation_prompt=False)
        if self.config.truncate_prompt == "left":
            extra.update(
                truncate_prompt_tokens=max(1, self.config.max_model_len - spec.max_tokens), truncation_side="left"
            )
        body: dict[str, Any] = {
            "messages": spec.request.messages,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "extra_body": extra,
        }
        if spec.stop:
            body["stop"] = spec.stop
        if spec.seed is not None:
            body["seed"] = spec.seed
        return body

    async def _one(self, spec: CallSpec) -> Completion:
        url = self._pick_url()
        self.in_flight[url] += 1
        try:
            async with self._slots[url]:
                served_name = adapter_name(spec.adapter) if spec.adapter and "/" in spec.adapter else spec.adapter
                model = served_name or await self._base_name(url)
                body = self.body(spec)
                start = time.perf_counter()
                what = f"role '{spec.request.role}' (model={model})"
                resp = await self._with_retries(
                    url, what, lambda: self._clients[url].chat.completions.create(model=model, **body)
                )
                latency = time.perf_counter() - start
        finally:
            self.in_flight[url] -= 1
        self.served[url] += 1
        choice = resp.choices[0]
        text, reasoning = split_thinking(choice.message.content or "")
        server_reasoning = getattr(choice.message, "reasoning", None) or getattr(
            choice.message, "reasoning_content", None
        )  # with --reasoning-parser the server splits it
        usage = resp.usage
        return Completion(
            text=text,
            reasoning=server_reasoning or reasoning,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            latency_s=latency,
            model=resp.model or model,
            adapter=served_name,
            finish_reason=choice.finish_reason,
            role=spec.request.role,
            constrained=spec.json_schema is not None,
            **spec.sampling_used(),
        )

    async def _all(self, specs: list[CallSpec]) -> list[Completion]:
        tasks = [asyncio.ensure_future(self._one(s)) for s in specs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # on the first failure, stop the rest instead of leaving them running
                task.cancel()

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        if not requests:
            return []
        routes = routes or [default_route()] * len(requests)
        specs = [call_spec(req, route) for req, route in zip(requests, routes)]
        return self._run(self._all(specs))

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def shutdown():
            for client in self._clients.values():
                await client.close()

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
