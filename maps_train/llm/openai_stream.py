"""Streamed requests to an OpenAI-compatible server, given up only when the server stops making progress.

Each request is streamed (`stream=True` with `stream_options.include_usage`, so the last chunk carries the usage,
reasoning tokens included), and each chunk that arrives is a sign of life: a long answer has no wall-clock limit.
A request is given up when no chunk of it came for `backend.stall_timeout_s` and its server showed no progress
over that time either: vLLM's `/metrics` token counters (`vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`) did not move. A request waiting in a busy server's queue, or one of many sharing
slow cores, so waits as long as the server works; a server that froze, or one without vLLM's metrics, gets
`stall_timeout_s` between chunks. Given up means cancelled: the stream's connection is closed, which aborts the
request in vLLM's server, and it is not sent again; the call fails with one line. The SDK keeps its retries for
what fails before a stream starts (connection errors, 408/409/429, 5xx): the server never ran those.

A server that answers a streamed request with one JSON body (some OpenAI-compatible servers, test doubles) is
read as the non-streamed reply it is.
"""

from __future__ import annotations

import asyncio
import math
import time
from types import SimpleNamespace
from typing import Any

import httpx

from maps_train.llm.call_spec import CallSpec
from maps_train.llm.thinking import estimated_reasoning_tokens, generation_opens_thinking, split_thinking

PROGRESS_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def tokens_counted(metrics_text: str) -> float | None:
    """The sum of vLLM's prompt and generation token counters in a Prometheus text page (None: no such counter)."""
    values = [float(line.rsplit(None, 1)[-1]) for line in metrics_text.splitlines()
              if line.startswith(PROGRESS_COUNTERS) and not line.startswith("#")]
    return sum(values) if values else None


class ServerProgress:
    """When one server was last seen working: its token counters read at most every `every_s` seconds (shared by
    all of its requests), the time of the read that found them moved."""

    def __init__(self, url: str, every_s: float):
        self.metrics_url = url.removesuffix("/v1") + "/metrics"
        self.every_s = every_s
        self.moved_at = -math.inf
        self._counted: float | None = None
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def last_moved(self) -> float:
        async with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.every_s:
                self._read_at = now
                counted = await self._read()
                if counted is not None and self._counted is not None and counted != self._counted:
                    self.moved_at = now
                self._counted = counted if counted is not None else self._counted
        return self.moved_at

    async def _read(self) -> float | None:
        try:
            async with httpx.AsyncClient(timeout=max(1.0, self.every_s)) as client:
                page = await client.get(self.metrics_url)
        except httpx.HTTPError:
            return None  # a frozen or metric-less server shows no progress
        return tokens_counted(page.text) if page.status_code == 200 else None


class Stalled(Exception):
    """A request that got no token for `stall_s` while its server showed no progress (it has been cancelled)."""

    def __init__(self, stall_s: float, chunks: int):
        super().__init__(f"no new token for {stall_s:.0f}s (after {chunks} chunks) while the server's token "
                         f"counters did not move either; the request was cancelled, not resent "
                         f"(backend.stall_timeout_s)")


async def watched(consume, progress: ServerProgress, stall_s: float) -> Any:
    """Run `consume(seen)` (which calls `seen()` on each chunk) until it returns; cancel it once neither it nor its
    server has moved for `stall_s` seconds, and raise `Stalled`."""
    last = {"at": time.monotonic(), "chunks": 0}

    def seen() -> None:
        last["at"] = time.monotonic()
        last["chunks"] += 1

    task = asyncio.ensure_future(consume(seen))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=progress.every_s)
            if done:
                return task.result()
            if time.monotonic() - last["at"] < progress.every_s:
                continue
            alive = max(last["at"], await progress.last_moved())
            if time.monotonic() - alive > stall_s:
                task.cancel()  # closes the stream's connection: vLLM aborts the request
                await asyncio.gather(task, return_exceptions=True)
                raise Stalled(stall_s, last["chunks"])
    finally:
        task.cancel()  # a caller cancelled (the run failed): the request goes with it


async def read_stream(stream: Any, seen) -> Any:
    """A reply shaped as the SDK's non-streamed one (`choices[0].message` or `.text`, `finish_reason`,
    `stop_reason`, `usage`, `model`), put together from a stream's chunks; the stream is closed on the way out."""
    async with stream:
        if not stream.response.headers.get("content-type", "").startswith("text/event-stream"):
            return await _whole(stream)
        content, reasoning, text = [], [], []
        reply = SimpleNamespace(model=None, usage=None, finish_reason=None, stop_reason=None)
        async for chunk in stream:
            seen()
            reply.model = chunk.model or reply.model
            reply.usage = chunk.usage or reply.usage
            for choice in chunk.choices:
                delta = getattr(choice, "delta", None)
                if delta is not None:
                    content.append(delta.content or "")
                    reasoning.append(getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content", None)
                                     or "")
                else:
                    text.append(choice.text or "")
                reply.finish_reason = choice.finish_reason or reply.finish_reason
                reply.stop_reason = getattr(choice, "stop_reason", None) or reply.stop_reason
    message = SimpleNamespace(content="".join(content), reasoning="".join(reasoning) or None)
    choice = SimpleNamespace(message=message, text="".join(text), finish_reason=reply.finish_reason,
                             stop_reason=reply.stop_reason)
    return SimpleNamespace(model=reply.model, usage=reply.usage, choices=[choice])


async def _whole(stream: Any) -> Any:
    """The reply of a server that did not stream: one JSON body, read as the SDK reads a non-streamed one."""
    import json

    from openai.types import Completion as TextCompletion
    from openai.types.chat import ChatCompletion

    body = json.loads(await stream.response.aread())
    kind = TextCompletion if body.get("object") == "text_completion" else ChatCompletion
    return kind.model_validate(body)


def split_chat(spec: CallSpec, prompt: str | None, message: Any, usage: Any) -> tuple[str, str | None, int]:
    """(answer, reasoning, reasoning tokens) of a chat reply. A server with a reasoning parser split it already
    and counted the tokens (it reports `completion_tokens_details`); otherwise split the content here."""
    content = message.content or ""
    server_reasoning = getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)
    details = getattr(usage, "completion_tokens_details", None) if usage else None
    counted = getattr(details, "reasoning_tokens", None) if details is not None else None
    if counted is not None or server_reasoning:
        text, reasoning = split_thinking(content)  # a reply with tags left in it (a parser that kept them)
        return text, server_reasoning or reasoning, int(counted or 0)
    opened = prompt is not None and generation_opens_thinking(prompt, spec)
    text, reasoning = split_thinking(content, opened)
    total = usage.completion_tokens if usage else 0
    return text, reasoning, estimated_reasoning_tokens(total, text, reasoning)


def stop_string(choice: Any) -> str | None:
    """The stop string that ended a choice: vLLM's server says it (`stop_reason`, an int for a stop token)."""
    reason = getattr(choice, "stop_reason", None)
    return reason if isinstance(reason, str) else None
