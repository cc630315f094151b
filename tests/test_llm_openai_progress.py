"""The OpenAI backend against a real `vllm serve` that is slow or frozen (issue 64): a request is given up only when
its server stops making progress, and a request given up is cancelled, never sent again while it still runs.

The session's `vllm_server` (SmolLM2) is shared; a loopback relay in front of it counts the chat requests it is
sent. The prompt has SmolLM2 count on (greedy), so a request runs to its `max_tokens` and takes as long as the test
needs (each test checks that it did: finish reason "length")."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.openai_backend import OpenAIBackend
from maps_train.recipe import BackendConfig, RoleRoute

CHAT_PATH = b"POST /v1/chat/completions"
PROMPT = [{"role": "user", "content": "Count from 1 to 5000, one number after another: 1, 2, 3, 4, 5,"}]


class CountingProxy:
    """A TCP relay on loopback in front of the real server: forwards bytes both ways, closes one side when the
    other closes (so a client that hangs up hangs up on the server too), and counts the chat requests."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.chat_requests = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self.thread.start()
        start = asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result()
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    async def _relay(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        sent = bytearray()

        async def pipe(reader, writer, count: bool) -> None:
            while data := await reader.read(65536):
                if count:
                    before = sent.count(CHAT_PATH)
                    sent.extend(data)
                    self.chat_requests += sent.count(CHAT_PATH) - before
                writer.write(data)
                await writer.drain()

        pipes = [asyncio.ensure_future(pipe(client_reader, server_writer, True)),
                 asyncio.ensure_future(pipe(server_reader, client_writer, False))]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for task in pipes:
            task.cancel()
        for writer in (client_writer, server_writer):
            writer.close()

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def metric(base_url: str, name: str, *labels: str) -> float:
    """The sum of a vLLM metric's samples (those with any of `labels`, if given), read straight from the server."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(float(line.rsplit(None, 1)[-1]) for line in text.splitlines()
               if line.startswith(name + "{") and (not labels or any(label in line for label in labels)))


def finished(base_url: str) -> float:
    """Requests the server ran to their end (a stop or max_tokens), aborted ones not counted."""
    return metric(base_url, "vllm:request_success_total", 'finished_reason="stop"', 'finished_reason="length"')


def server_group(port: int) -> int:
    """The process group of the `vllm serve` listening on `port` (API server and engine core)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == str(port) and any("api_server" in c for c in cmd):
            return os.getpgid(proc.pid)
    raise AssertionError(f"no vllm api_server on port {port}")


def long_request(max_tokens: int) -> tuple[ChatRequest, RoleRoute]:
    route = RoleRoute(backend="openai", max_tokens=max_tokens, structured=False)
    return ChatRequest(role="writer", messages=PROMPT), route


def backend_on(url: str, stall_timeout_s: float) -> OpenAIBackend:
    # truncate_prompt=left: the server cuts an over-long prompt, so no tokenizer is loaded here
    return OpenAIBackend(BackendConfig(base_urls=[url], stall_timeout_s=stall_timeout_s, request_timeout_s=30,
                                       max_model_len=2048, truncate_prompt="left"))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the session's server starts first: minutes on a busy 2-core machine
def test_long_requests_on_a_busy_server_finish_where_a_wall_clock_timeout_fails(vllm_server):
    """Six requests of 64 tokens at once on the CPU server: each takes longer than the limit set here (a third
    of one such request's time alone), which a per-request timeout (today's setting, the SDK's non-streamed call)
    fails on, and which the streamed backend, limited to the same seconds without progress, finishes; and no
    request was sent twice."""
    request, route = long_request(64)
    with CountingProxy(urlsplit(vllm_server).port) as proxy:
        alone = backend_on(proxy.url, stall_timeout_s=120)
        try:
            [solo] = alone.generate([request], [route])
        finally:
            alone.close()
        assert (solo.completion_tokens, solo.finish_reason) == (64, "length")  # it counted on to the cap
        limit_s = solo.latency_s / 3

        old_errors: list[BaseException] = []

        def as_before() -> None:  # one more of the same requests, as the backend sent it before: no stream
            client = openai.OpenAI(base_url=vllm_server, api_key="x", timeout=limit_s, max_retries=0)
            try:
                client.chat.completions.create(model=solo.model, messages=PROMPT, max_tokens=64, temperature=0)
            except openai.APITimeoutError as err:
                old_errors.append(err)

        backend = backend_on(proxy.url, stall_timeout_s=limit_s)
        old = threading.Thread(target=as_before)
        try:
            old.start()
            completions = backend.generate([request] * 6, [route] * 6)
        finally:
            old.join(timeout=600)
            backend.close()
    assert [(c.completion_tokens, c.finish_reason) for c in completions] == [(64, "length")] * 6
    assert len(old_errors) == 1, "the non-streamed request with the same limit should have timed out"
    assert proxy.chat_requests == 1 + 6  # the solo request and the six: none resent


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_stalled_request_is_cancelled_and_never_sent_again(vllm_server):
    """The server frozen (SIGSTOP) mid-request: the backend gives the request up after `stall_timeout_s` without
    a token or a move of the server's counters, closes its stream, and does not resend it. Once thawed, the server
    aborts its one copy of the request (it never finishes it) and holds no other."""
    port = urlsplit(vllm_server).port
    group = server_group(port)
    finished_before = finished(vllm_server)
    request, route = long_request(1500)
    outcome: list[BaseException | object] = []
    with CountingProxy(port) as proxy:
        backend = backend_on(proxy.url, stall_timeout_s=3)

        def call() -> None:
            try:
                outcome.append(backend.generate([request], [route]))
            except MapsTrainError as err:
                outcome.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        frozen = False
        try:
            for _ in range(600):  # until the server runs it (tokens are flowing), at most a minute
                if metric(vllm_server, "vllm:num_requests_running") >= 1:
                    break
                caller.join(timeout=0.1)
            os.killpg(group, signal.SIGSTOP)
            frozen = True
            caller.join(timeout=120)
        finally:
            if frozen:
                os.killpg(group, signal.SIGCONT)
            backend.close()
        assert not caller.is_alive()
        for _ in range(1200):  # the thawed server sees the closed stream and aborts the request
            if metric(vllm_server, "vllm:num_requests_running") == 0:
                break
            caller.join(timeout=0.1)
    [error] = outcome
    assert isinstance(error, MapsTrainError), error
    assert "stalled on role 'writer'" in str(error) and "cancelled, not resent" in str(error)
    assert proxy.chat_requests == 1
    assert metric(vllm_server, "vllm:num_requests_running") == 0
    assert finished(vllm_server) == finished_before  # aborted, not run to the end

