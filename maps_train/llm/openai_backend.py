"""OpenAI-compatible HTTP backend for `vllm serve` (one or several servers).

Requests run concurrently on a private asyncio loop (bounded by `backend.concurrency` per server), each sent to
the least-loaded of `backend.base_urls`. The adapter is chosen with `model=NAME` (a route's `adapter`, or its
folder name when it is a path: serve adapters as `--lora-modules NAME=PATH`); base-model rows use the server's
base model (found once from `/v1/models`). Each request sends its own `temperature`, `top_p` and, when set, `seed`
(the route's, overridden by the request's). vLLM extras go in `extra_body`: `chat_template_kwargs`,
`structured_outputs={"json": schema}`, and for `truncate_prompt: left` the server's `truncate_prompt_tokens`
(keeps the newest tokens). With `shrink` (the default) and `error`, a prompt is counted here with the route
model's tokenizer and shrunk to fit before it is sent (`fit_request`); a model with no tokenizer here is sent as
built (the server refuses a prompt over its context).

Requests are streamed, and a request is given up only when it and its server stop making progress
(`backend.stall_timeout_s`; see `llm.openai_stream`): a long answer on a busy server is not a timeout, and a request
given up is cancelled, never resent. What fails before a stream starts (connection errors and timeouts, 408/409/429,
5xx: the server never ran it) is retried by the openai SDK itself (`backend.max_retries`; its backoff: 0.5 s
doubling to 8 s with jitter, a server's `Retry-After` honoured); then, as on any other refusal, one MapsTrainError
line.

The API key comes from `backend.api_key`, or when that is empty from `$OPENAI_API_KEY`, so that recipes (which are
logged and shared) need not hold it.

Thinking: `enable_thinking` travels in `chat_template_kwargs`. A server started with `--reasoning-parser qwen3`
(`maps-train serve` adds it when a route thinks) returns the reasoning apart and applies a JSON schema only after
`</think>`; it says so by reporting `usage.completion_tokens_details.reasoning_tokens`, which becomes the
completion's `reasoning_tokens`. Without one, the reasoning is split off the content here (a template that opens
`<think>` in the prompt is read from the route's tokenizer) and its tokens are estimated. A raw continuation
(`ChatRequest.raw_continuation`) goes to `/v1/completions`: the conversation rendered here with the route model's
chat template, then the text, sent as one prompt string without added special tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import Counter
from typing import Any

import httpx  # here, not in the loop threads: backends built at once by parallel suite runs raced on its import

from maps_train.config.redaction import redact_text
from maps_train.errors import MapsTrainError
from maps_train.llm.adapter_folders import adapter_name
from maps_train.llm.call_spec import CallSpec, call_spec, default_route
from maps_train.llm.openai_errors import answered, one_line
from maps_train.llm.openai_stream import ServerProgress, read_stream, split_chat, stop_string, watched
from maps_train.llm.prompt_fit import fit_request
from maps_train.llm.rendering import render_prompt
from maps_train.llm.thinking import generation_opens_thinking, split_thinking, think_tags_special
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import BackendConfig, RoleRoute

NO_KEY = "EMPTY"  # what the client sends when no key is set: a vLLM server without --api-key accepts anything


def api_key(config: BackendConfig) -> str:
    """`backend.api_key`, else `$OPENAI_API_KEY`, else a placeholder (the client refuses an empty key)."""
    return config.api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY


class OpenAIBackend:
    kind = "openai"
    concurrent = True  # generate() may be called from many threads: each call's requests join the shared loop

    def __init__(self, config: BackendConfig | None = None):
        self.config = config or BackendConfig()
        if not self.config.base_urls:
            raise MapsTrainError("backend.base_urls: empty; give at least one server URL (http://HOST:PORT/v1)")
        self.urls = [u.rstrip("/") for u in self.config.base_urls]
        self.in_flight = Counter({u: 0 for u in self.urls})
        self.served = Counter()  # url -> requests answered there
        self._base_names: dict[str, str] = {}
        self._tokenizers: dict[str, Any] = {}  # route model -> its tokenizer (raw continuations, thinking splits)
        self._tokenizer_errors: dict[str, str] = {}  # route model -> why it has none here
        self._tokenizer_lock = threading.Lock()
        self._turn = itertools.count()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-backend", daemon=True)
        self._thread.start()
        self._clients = self._run(self._make_clients())

    # -- event loop plumbing --------------------------------------------------------------------------------

    def _run(self, coro):
        if self._closed:
            coro.close()
            raise MapsTrainError("backend.base_urls: the openai backend is closed (the run ended)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _make_clients(self):
        from openai import AsyncOpenAI, Timeout

        self._slots = {u: asyncio.Semaphore(max(1, self.config.concurrency)) for u in self.urls}
        self._up: set[str] = set()  # servers whose /health answered (backend.server_wait_s)
        self._up_lock = asyncio.Lock()
        check_every_s = min(5.0, max(0.5, self.config.stall_timeout_s / 4))
        self._progress = {u: ServerProgress(u, check_every_s) for u in self.urls}
        # No read timeout: a streamed request's wait between tokens is `watched`'s (it knows whether the server works)
        timeout = Timeout(self.config.request_timeout_s, read=None)
        return {
            u: AsyncOpenAI(base_url=u, api_key=api_key(self.config), timeout=timeout,
                           max_retries=self.config.max_retries)
            for u in self.urls
        }

    def _pick_url(self) -> str:
        """Least loaded; ties broken round-robin so an idle fleet still spreads."""
        low = min(self.in_flight[u] for u in self.urls)
        candidates = [u for u in self.urls if self.in_flight[u] == low]
        return candidates[next(self._turn) % len(candidates)]

    async def _ready(self, url: str) -> None:
        """With `backend.server_wait_s`, the first request to a server waits until its /health answers: a run may
        start while its server is still starting. Past the wait, one MapsTrainError line."""
        if self.config.server_wait_s <= 0 or url in self._up:
            return
        async with self._up_lock:
            if url in self._up:
                return
            health = url.removesuffix("/v1") + "/health"
            deadline = time.monotonic() + self.config.server_wait_s
            async with httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    try:
                        if (await client.get(health)).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise MapsTrainError(f"backend.server_wait_s: {redact_text(health)} did not answer "
                                             f"within {self.config.server_wait_s:.0f}s")
                    await asyncio.sleep(0.5)
            self._up.add(url)

    async def _base_name(self, url: str) -> str:
        """The server's base model id (the model card without a parent adapter)."""
        if url not in self._base_names:
            models = self._clients[url].models
            page = await answered(url, "GET /models", lambda: models.list(timeout=self.config.request_timeout_s))
            cards = list(page.data)
            bases = [c.id for c in cards if getattr(c, "parent", None) is None] or [c.id for c in cards]
            if not bases:
                raise MapsTrainError(f"backend.base_urls: {redact_text(url)} serves no model")
            self._base_names[url] = bases[0]
        return self._base_names[url]

    # -- local rendering ------------------------------------------------------------------------------------

    def tokenizer(self, model: str, role: str) -> Any:
        """The tokenizer of a route's model (its chat template renders raw continuations), loaded once; a model
        that has none here is tried once too (None is remembered), and named in a one-line error."""
        with self._tokenizer_lock:  # calling threads of the continuous schedule load it once between them
            if model not in self._tokenizers:
                from transformers import AutoTokenizer

                from maps_train.models import resolve_model

                try:
                    self._tokenizers[model] = AutoTokenizer.from_pretrained(resolve_model(model))
                except (OSError, ValueError, MapsTrainError) as err:
                    self._tokenizers[model] = None
                    self._tokenizer_errors[model] = one_line(err)
        if self._tokenizers[model] is None:
            raise MapsTrainError(
                f"roles.{role}.model: '{model}' has no tokenizer here to render its chat template "
                f"({self._tokenizer_errors[model]}); the openai backend renders raw continuations locally"
            )
        return self._tokenizers[model]

    def local_prompt(self, spec: CallSpec) -> str | None:
        """The prompt text rendered here: always for a raw continuation; for a thinking chat request, to know
        whether the template opened `<think>` (when the server does not split the reasoning); else None."""
        if spec.request.raw_continuation is not None:
            return render_prompt(self.tokenizer(spec.route.model, spec.request.role), spec)
        if not spec.chat_template_kwargs.get("enable_thinking"):
            return None
        try:  # only a fallback for servers without a reasoning parser: a model named as served may not load here
            return render_prompt(self.tokenizer(spec.route.model, spec.request.role), spec)
        except MapsTrainError:
            return None

    # -- generation -----------------------------------------------------------------------------------------

    def completion_body(self, spec: CallSpec, prompt: str) -> dict[str, Any]:
        """`/v1/completions` for a raw continuation: the rendered prompt as it stands (no BOS added: vLLM's chat
        path tokenises its rendered text the same way)."""
        body = self.body(spec)
        body.pop("messages")
        extra = body["extra_body"]
        for key in ("chat_template_kwargs", "continue_final_message", "add_generation_prompt"):
            extra.pop(key, None)
        extra["add_special_tokens"] = False
        if think_tags_special(self.tokenizer(spec.route.model, spec.request.role)):
            extra["skip_special_tokens"] = False  # the server would drop `</think>` (see llm.thinking.think_tags_special)
        return {"prompt": prompt, **body}

    def body(self, spec: CallSpec) -> dict[str, Any]:
        # vLLM's sampling beyond the OpenAI API's, always sent: a server fills unset fields from the model's
        # generation_config.json (top_k 20 for Qwen3), which in-process vLLM and transformers would not do.
        extra: dict[str, Any] = {
            "chat_template_kwargs": spec.chat_template_kwargs,
            "top_k": spec.top_k,
            "min_p": spec.min_p,
            "repetition_penalty": spec.repetition_penalty,
        }
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
            "presence_penalty": spec.presence_penalty,
            "extra_body": extra,
        }
        if spec.stop:
            body["stop"] = spec.stop
        if spec.seed is not None:
            body["seed"] = spec.seed
        return body

    def fit(self, spec: CallSpec) -> tuple[CallSpec, dict[str, Any]]:
        """The request as it is sent, and what its completion reports about fitting (see `fit_request`)."""
        if self.config.truncate_prompt == "left":
            return spec, {}  # the server cuts the oldest tokens (`truncate_prompt_tokens`)
        try:
            tok = self.tokenizer(spec.route.model, spec.request.role)
        except MapsTrainError:
            if spec.request.raw_continuation is not None:
                raise  # rendered here anyway: the tokenizer's error is the one to see
            return spec, {}
        fitted = fit_request(tok, spec, self.config.max_model_len, self.config.truncate_prompt)
        return fitted.spec, fitted.completion_fields()

    async def _one(self, spec: CallSpec, prompt: str | None, fitting: dict[str, Any]) -> Completion:
        url = self._pick_url()
        self.in_flight[url] += 1
        raw = spec.request.raw_continuation is not None
        try:
            async with self._slots[url]:
                await self._ready(url)
                served_name = adapter_name(spec.adapter) if spec.adapter and "/" in spec.adapter else spec.adapter
                model = served_name or await self._base_name(url)
                start = time.perf_counter()
                what = f"role '{spec.request.role}' (model={model})"
                consume = self._consumer(url, model, spec, prompt)
                resp = await answered(
                    url, what, lambda: watched(consume, self._progress[url], self.config.stall_timeout_s))
                latency = time.perf_counter() - start
        finally:
            self.in_flight[url] -= 1
        self.served[url] += 1
        choice = resp.choices[0]
        usage = resp.usage
        completion_tokens = usage.completion_tokens if usage else 0
        if raw:
            text, reasoning, reasoning_tokens = self._split_raw(spec, prompt or "", choice.text or "")
        else:
            text, reasoning, reasoning_tokens = split_chat(spec, prompt, choice.message, usage)
        return Completion(
            text=text,
            reasoning=reasoning,
            generated=(choice.text or "") if raw else None,  # a chat reply may have been split by the server
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=completion_tokens,
            reasoning_tokens=min(reasoning_tokens, completion_tokens),
            latency_s=latency,
            model=resp.model or model,
            adapter=served_name,
            finish_reason=choice.finish_reason,
            stop_string=stop_string(choice),
            role=spec.request.role,
            constrained=spec.json_schema is not None,
            **spec.sampling_used(),
            **fitting,
        )

    def _consumer(self, url: str, model: str, spec: CallSpec, prompt: str | None):
        """The streamed call (`/v1/completions` for a raw continuation, `/v1/chat/completions` otherwise) and the
        reading of its chunks, as one coroutine function of the chunk callback (see `openai_stream.watched`)."""
        client = self._clients[url]
        streamed = {"stream": True, "stream_options": {"include_usage": True}}
        if spec.request.raw_continuation is not None:
            body = self.completion_body(spec, prompt or "")
            create = lambda: client.completions.create(model=model, **body, **streamed)  # noqa: E731
        else:
            body = self.body(spec)
            create = lambda: client.chat.completions.create(model=model, **body, **streamed)  # noqa: E731

        async def consume(seen):
            return await read_stream(await create(), seen)

        return consume

    def _split_raw(self, spec: CallSpec, prompt: str, generated: str) -> tuple[str, str | None, int]:
        """A completion of a raw continuation: split here (the completions API does not), tokens counted with
        the route's tokenizer."""
        text, reasoning = split_thinking(generated, generation_opens_thinking(prompt, spec))
        if reasoning is None:
            return text, None, 0
        tok = self.tokenizer(spec.route.model, spec.request.role)
        head = generated.partition("</think>")[0] + ("</think>" if text else "")
        return text, reasoning, len(tok(head, add_special_tokens=False)["input_ids"])

    async def _all(
        self, specs: list[CallSpec], prompts: list[str | None], fittings: list[dict[str, Any]]
    ) -> list[Completion]:
        tasks = [asyncio.ensure_future(self._one(s, p, f)) for s, p, f in zip(specs, prompts, fittings)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # on the first failure, stop the rest instead of leaving them running
                task.cancel()

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        if not requests:
            return []
        routes = routes or [default_route()] * len(requests)
        # Fitting and rendering here, not on the event loop: tokenizers load slowly.
        fits = [self.fit(call_spec(req, route)) for req, route in zip(requests, routes)]
        specs = [spec for spec, _ in fits]
        prompts = [self.local_prompt(s) for s in specs]
        return self._run(self._all(specs, prompts, [fitting for _, fitting in fits]))

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel the calls still in flight (their callers, question threads of a run that failed, get an error
        instead of waiting forever on a loop that stopped), close the clients, stop the loop; each step bounded
        by `timeout_s`, so a server that stalls cannot hold up the end of a command."""
        if self._closed or self._loop.is_closed():
            return
        self._closed = True

        async def shutdown():
            here = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not here]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=timeout_s)
            for client in self._clients.values():
                await client.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=timeout_s)
        except TimeoutError:
            pass  # a client that would not close in time: the loop stops anyway and its sockets go with the process
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

