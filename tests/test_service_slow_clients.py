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
    """The real retriever, recording each search's size and whether the small request's query was in it; the first
    search waits for the test's gate, so the requests sent meanwhile are all waiting when the worker next looks."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.entered, self.gate = threading.Event(), threading.Event()

    def search(self, queries, k):
        self.calls.append((len(queries), "one small query" in queries))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.gate.wait(30)
        return self.inner.search(queries, k)


def test_a_one_query_request_is_answered_before_a_queued_300_query_request_finishes(bm25):
    """A 300-query request is cut into calls of at most `max_batch` queries: a one-query request sent while its
    first call runs rides in a later call and is answered while the heavy request still has queries to search."""

    async def scenario(retriever):
        searcher = BatchingSearcher(retriever, max_batch=32, max_wait_ms=1)
        await searcher.start()
        try:
            heavy = asyncio.create_task(searcher.search([f"heavy query {j} about a river" for j in range(300)], 20))
            await asyncio.to_thread(retriever.entered.wait, 30)  # the heavy request's first call is running
            light = asyncio.create_task(searcher.search(["one small query"], 2))
            for _ in range(10):  # the light task runs up to its (immediate) place in the queue
                await asyncio.sleep(0)
            retriever.gate.set()  # then the first call may finish
            light_hits = await light
            unsearched = 300 - (sum(size for size, _ in retriever.calls) - 1)  # calls begun count as searched
            heavy_hits = await heavy
        finally:
            await searcher.stop()
        return light_hits, unsearched, heavy_hits

    retriever = GatedRecorder(bm25)
    light_hits, unsearched, heavy_hits = asyncio.run(scenario(retriever))
    assert unsearched > 0, retriever.calls  # answered before the heavy request was searched whole
    assert [hit.id for hit in light_hits[0]] == [hit.id for hit in bm25.search(["one small query"], 2)[0]]
    assert len(heavy_hits) == 300 and all(len(hits) <= 20 for hits in heavy_hits)
    assert max(size for size, _ in retriever.calls) <= 32


def test_a_one_query_request_rides_in_the_next_call_beside_40_heavy_requests(bm25):
    """40 heavy requests waiting (as 40 clients that do not read would leave them): the one-query request still
    rides in the call after the one in flight, and each call stays within `max_batch` queries."""

    async def scenario(retriever):
        searcher = BatchingSearcher(retriever, max_batch=32, max_wait_ms=1)
        await searcher.start()
        try:
            heavy = [
                asyncio.create_task(searcher.search([f"heavy {i} query {j}" for j in range(64)], 4)) for i in range(40)
            ]
            await asyncio.to_thread(retriever.entered.wait, 30)
            light = asyncio.create_task(searcher.search(["one small query"], 2))
            for _ in range(10):
                await asyncio.sleep(0)
            retriever.gate.set()
            await asyncio.gather(light, *heavy)
        finally:
            await searcher.stop()

    retriever = GatedRecorder(bm25)
    asyncio.run(scenario(retriever))
    assert [light_in for _, light_in in retriever.calls].index(True) == 1, retriever.calls[:3]
    assert max(size for size, _ in retriever.calls) <= 32
    assert sum(size for size, _ in retriever.calls) == 40 * 64 + 1


class PoisonedLater:
    """The real BM25 retriever, except that a search holding the query "poison" raises (as a tokenizer once did)."""

    def __init__(self, inner):
        self.inner = inner

    def search(self, queries, k):
        if "poison" in queries:
            raise ValueError("poisoned slice")
        return self.inner.search(queries, k)


def test_a_later_slice_that_fails_cuts_the_answer_in_one_line(bm25, caplog):
    """40 queries in calls of 32: the first part is sent (200) before the second slice's search raises, so the
    answer is cut; the client says so in one line, the service logs one line and counts it, and still answers."""
    from maps_train.errors import MapsTrainError
    from maps_train.retrieval.client import RetrievalClient

    queries = [f"river number {i}" for i in range(35)] + ["poison"] + [f"valley {i}" for i in range(4)]
    app = create_app(PoisonedLater(bm25), max_batch=32, max_wait_ms=1)
    with caplog.at_level(logging.WARNING), serving(app) as url:
        client = RetrievalClient(url, retries=0)
        try:
            client.search(queries, 3)
        except MapsTrainError as err:
            message = str(err)
        else:
            message = ""
        assert "the answer was cut off" in message and "\n" not in message
        assert app.state.searcher.stats.cut == 1
        assert client.search(["Neil Peart drummer"], 2)[0]  # the service still answers
    lines = [r.getMessage() for r in caplog.records if "cut /search response" in r.getMessage()]
    assert len(lines) == 1 and "a later slice failed: ValueError: poisoned slice" in lines[0]
