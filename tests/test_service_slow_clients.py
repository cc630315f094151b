"""The retrieval service outlasts clients that send slowly or leave: a body not read within `read_timeout_s` is
dropped with HTTP 408 and the connection closed, a client that goes away mid-body is dropped, and each drop is
ONE log line (never a traceback), counted in /health; a small request is not starved by heavy ones queued before
it. The real service on loopback (uvicorn) over the real BM25 index, raw sockets for the clients no real client
would be."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import httpx
from test_retrieval_service_limits import serving

from maps_train.retrieval.service import BatchingSearcher, ServiceLimits, create_app

HEAD = b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"


def partial_request(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(HEAD + b'{"queries": ["who')  # 17 of the 200 bytes announced, then nothing
    return sock


def dropped(url: str) -> int:
    return httpx.get(f"{url}/health", timeout=10).json()["stats"]["dropped"]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_stalled_body_is_dropped_after_the_read_timeout(bm25, caplog):
    with caplog.at_level(logging.WARNING), serving(create_app(bm25, limits=ServiceLimits(read_timeout_s=1))) as url:
        sock = partial_request(url)
        started = time.monotonic()
        reply = b""
        while chunk := sock.recv(4096):  # the service answers by itself, then closes the connection
            reply += chunk
        waited = time.monotonic() - started
        sock.close()
        assert reply.startswith(b"HTTP/1.1 408 ") and b"(--read-timeout-s)" in reply
        assert waited < 20
        good = httpx.post(f"{url}/search", json={"queries": ["river"], "k": 2}, timeout=30)
        assert good.status_code == 200 and len(good.json()["hits"]) == 1  # a good request still answered
        assert dropped(url) == 1
    lines = [r.getMessage() for r in caplog.records if "dropped /search" in r.getMessage()]
    assert len(lines) == 1 and "body not read within 1 s (--read-timeout-s)" in lines[0]
    assert not [r for r in caplog.records if r.exc_info]


def test_a_client_gone_mid_body_is_one_log_line_not_a_traceback(bm25, caplog):
    with caplog.at_level(logging.WARNING), serving(create_app(bm25, limits=ServiceLimits(read_timeout_s=60))) as url:
        for _ in range(3):
            partial_request(url).close()
        assert wait_until(lambda: dropped(url) == 3, 30), dropped(url)
    lines = [r.getMessage() for r in caplog.records if "dropped /search" in r.getMessage()]
    assert len(lines) == 3 and all("went away before its body was read" in line for line in lines)
    assert not [r for r in caplog.records if r.exc_info]


class GatedRecorder:
    """The real retriever, recording each search's size; the first search waits for the test's gate, so the
    requests sent meanwhile are all waiting when the worker next looks."""

    def __init__(self, inner):
        self.inner, self.sizes = inner, []
        self.entered, self.gate = threading.Event(), threading.Event()

    def search(self, queries, k):
        self.sizes.append(len(queries))
        if len(self.sizes) == 1:
            self.entered.set()
            assert self.gate.wait(30)
        return self.inner.search(queries, k)


def test_a_small_request_waits_for_one_heavy_search_not_for_every_heavy_request(bm25):
    async def scenario(retriever):
        searcher = BatchingSearcher(retriever, max_batch=64, max_wait_ms=1)
        await searcher.start()
        try:
            heavy = [asyncio.create_task(searcher.search([f"heavy {i} {j}" for j in range(64)], 2)) for i in range(4)]
            await asyncio.to_thread(retriever.entered.wait, 30)  # the first heavy search is running
            await asyncio.sleep(0)  # the other three heavy requests are queued behind it ...
            light = asyncio.create_task(searcher.search(["one small query"], 2))  # ... and then the small one
            await asyncio.sleep(0)  # it runs up to its (unbounded, so immediate) put on the queue
            await asyncio.sleep(0)
            retriever.gate.set()
            await asyncio.gather(light, *heavy)
        finally:
            await searcher.stop()

    retriever = GatedRecorder(bm25)
    asyncio.run(scenario(retriever))
    assert retriever.sizes == [64, 1, 64, 64, 64]  # the small request second, the heavy ones still all served
