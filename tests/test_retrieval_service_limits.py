"""Issue 36: no request takes the retrieval service down (limits, strict types, a bad query fails only its request).

The real service (uvicorn on loopback) over the real MiniLM + FAISS index of tests/fixtures_retrieval.py; raw httpx
sends what `RetrievalClient` never would. The one test double, `PoisonedRetriever`, makes a batch's search
raise on demand: every real input that used to raise is now refused before it can join a batch.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from fixtures_retrieval import QUERIES  # the index fixtures come from the plugin (tests/conftest.py)
from pydantic import ValidationError

from maps_train.errors import MapsTrainError
from maps_train.retrieval.client import RetrievalClient
from maps_train.retrieval.service import BatchingSearcher, ServiceLimits, create_app, request_model

POISON = "poison query that makes the whole search raise"


class PoisonedRetriever:
    """The real dense retriever, except that any search holding `POISON` raises (as a tokenizer once did)."""

    def __init__(self, inner):
        self.inner = inner

    def search(self, queries: list[str], k: int):
        if POISON in queries:
            raise ValueError("poisoned batch")
        return self.inner.search(queries, k)


@contextmanager
def serving(app):
    """`app` on a loopback socket bound before uvicorn starts: clients may connect at once (the kernel queues
    them until uvicorn accepts), so nothing polls for readiness."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def service(dense):
    """(url, stats) of one service with the default limits over the poisoned dense retriever."""
    app = create_app(PoisonedRetriever(dense), max_wait_ms=20)
    with serving(app) as url:
        yield url, app.state.searcher.stats


@pytest.fixture(scope="module")
def expected(dense) -> dict[str, list]:
    """Each query's top 5, searched in process."""
    return dict(zip(QUERIES, dense.search(QUERIES, k=5)))


def post(url: str, body: bytes, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/search", content=body, headers={"content-type": "application/json"}, timeout=60, **kwargs)


def body(queries, k) -> bytes:
    return json.dumps({"queries": queries, "k": k}).encode()


# (body, status, what the one-line detail must say)
REFUSED = {
    "100k queries at k=1000 (1.1 MB)": (body(["who"] * 100_000, 1000), 413, "queries: 100000 queries, over the limit "
                                        "of 2048 per request (--max-queries)"),
    "10k queries at k=1000": (body(["who"] * 10_000, 1000), 413, "(--max-queries)"),
    "k over max_k": (body(["who"], 1001), 413, "k: 1001, over the limit of 1000 (--max-k)"),
    "a query over max_query_chars": (body(["who", "w" * 2049], 1), 413, "queries[1]: 2049 characters, over the limit "
                                     "of 2048 (--max-query-chars)"),
    "queries x k over max_hits": (body(["who"] * 100, 1000), 413, "queries x k: 100 x 1000 = 100000 hits, over the "
                                  "limit of 32768 per request (--max-hits)"),
    "k a string": (b'{"queries": ["who"], "k": "3"}', 422, 'k: Input should be a valid integer, got string "3"'),
    "k a boolean": (b'{"queries": ["who"], "k": true}', 422, "k: Input should be a valid integer, got boolean true"),
    "k a float": (b'{"queries": ["who"], "k": 3.0}', 422, "k: Input should be a valid integer, got number 3.0"),
    "queries a string": (b'{"queries": "who", "k": 3}', 422, 'queries: Input should be a valid array, got string '
                         '"who"'),
    "a query not a string": (b'{"queries": ["who", 7], "k": 3}', 422, "queries[1]: Input should be a valid string"),
    "a lone surrogate": (b'{"queries": ["\\ud800"], "k": 3}', 422, "body: invalid JSON"),
    "an unknown field": (b'{"queries": ["who"], "top_k": 3}', 422, "top_k: unknown field"),
    "not JSON, over the body cap": (b"x" * (2 * 1024 * 1024 + 1), 413, "body: over the limit of 2097152 bytes "
                                    "(--max-body-bytes)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_reproducers_are_refused_naming_field_and_limit(service, case):
    url, stats = service
    payload, status, detail = REFUSED[case]
    searched = stats.requests
    response = post(url, payload)
    assert response.status_code == status, response.text
    assert detail in response.json()["detail"]
    assert "\n" not in response.json()["detail"]
    assert stats.requests == searched  # refused before it reached the batcher


def test_chunked_body_is_cut_off_at_the_cap(dense):
    """No Content-Length to check: the body is refused once the chunks read so far pass the cap."""

    def chunks():
        for _ in range(64):
            yield b" " * 1024

    app = create_app(dense, limits=ServiceLimits(max_body_bytes=4096))
    with serving(app) as url:
        response = httpx.post(f"{url}/search", content=chunks(), timeout=60)
        assert response.status_code == 413
        assert response.json()["detail"] == "body: over the limit of 4096 bytes (--max-body-bytes)"
        ok = post(url, body([QUERIES[0]], 2))
        assert ok.status_code == 200 and len(ok.json()["hits"][0]) == 2


def test_a_lone_surrogate_is_refused_by_the_model_too():
    """Bodies decoded elsewhere (json.loads keeps "\\ud800") still never reach the encoder."""
    with pytest.raises(ValidationError, match="unable to parse raw data as a unicode string"):
        request_model(ServiceLimits()).model_validate({"queries": ["fine", "\ud800"], "k": 1})


def test_a_failing_batch_is_rerun_request_by_request(dense, expected):
    """A batch whose search raises: each request runs alone, only the guilty one gets the error."""
    requests = [([QUERIES[0], QUERIES[1]], 3), ([POISON], 2), ([QUERIES[2]], 5), ([QUERIES[3], QUERIES[0]], 1)]

    async def run():
        # max_batch is exactly the queries sent, so the batch closes on size, never on the (long) wait
        searcher = BatchingSearcher(
            PoisonedRetriever(dense), max_batch=sum(len(q) for q, _ in requests), max_wait_ms=60_000
        )
        await searcher.start()
        try:
            outcomes = await asyncio.gather(*(searcher.search(q, k) for q, k in requests), return_exceptions=True)
        finally:
            await searcher.stop()
        return searcher.stats, outcomes

    stats, outcomes = asyncio.run(run())
    assert isinstance(outcomes[1], ValueError)
    for index in (0, 2, 3):
        queries, k = requests[index]
        assert [[hit.id for hit in hits] for hits in outcomes[index]] == [
            [hit.id for hit in expected[query][:k]] for query in queries
        ]
    assert (stats.search_calls, stats.isolated_batches) == (1 + len(requests), 1)


def test_one_large_k_does_not_merge_with_many_queries(dense, expected):
    """A call is searched at its largest k, so one k=50 request must not pull 10 queries into a 550-hit search:
    every call stays within `max_hits` queries x k, and each request still gets its own hits."""
    requests = [([QUERIES[0]], 50), ([QUERIES[i % len(QUERIES)] for i in range(10)], 5)]
    calls = []

    class Recorder:
        def search(self, queries, k):
            calls.append((len(queries), k))
            return dense.search(queries, k)

    async def run():
        searcher = BatchingSearcher(Recorder(), max_batch=256, max_wait_ms=200, max_hits=100)
        await searcher.start()
        try:
            outcomes = await asyncio.gather(*(searcher.search(q, k) for q, k in requests))
        finally:
            await searcher.stop()
        return searcher.stats, outcomes

    stats, outcomes = asyncio.run(run())
    assert calls and all(size * k <= 100 for size, k in calls), calls
    assert sum(size for size, _ in calls) == 11 and stats.search_calls == len(calls)
    assert [[hit.id for hit in hits] for hits in outcomes[1]] == [
        [hit.id for hit in expected[query][:5]] for query in requests[1][0]
    ]
    assert len(outcomes[0][0]) == 50


def test_good_requests_survive_concurrent_bad_ones(service, expected):
    """Good, malformed, oversized and poisoned requests at once: every good one gets 200 and the in-process hits."""
    url, stats = service
    good = [([QUERIES[(t + i) % len(QUERIES)], QUERIES[(3 * t + i + 1) % len(QUERIES)]], 1 + (t + i) % 5)
            for t in range(6) for i in range(6)]
    bad = [REFUSED[case][:2] for case in ("k a string", "k a boolean", "a lone surrogate", "queries x k over max_hits",
                                          "a query over max_query_chars", "10k queries at k=1000")] * 3
    poisoned = [body([POISON, QUERIES[0]], 3)] * 4
    threads_good, threads_bad = 6, 3
    barrier = threading.Barrier(threads_good + threads_bad + 1)
    good_answers, bad_answers, poison_answers, failures = {}, [], [], []

    def send_good(thread: int) -> None:
        barrier.wait()
        for index in range(thread, len(good), threads_good):
            queries, k = good[index]
            good_answers[index] = post(url, body(queries, k))

    def send_bad(thread: int) -> None:
        barrier.wait()
        for payload, status in bad[thread::threads_bad]:
            bad_answers.append((status, post(url, payload).status_code))

    def send_poison() -> None:
        barrier.wait()
        for payload in poisoned:
            poison_answers.append(post(url, payload))

    def guarded(target, *args):
        try:
            target(*args)
        except BaseException as err:  # surfaced below: a thread's exception would otherwise vanish
            failures.append(err)
            barrier.abort()

    refused_before = stats.refused
    threads = [threading.Thread(target=guarded, args=(send_good, t)) for t in range(threads_good)]
    threads += [threading.Thread(target=guarded, args=(send_bad, t)) for t in range(threads_bad)]
    threads.append(threading.Thread(target=guarded, args=(send_poison,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    assert sorted(good_answers) == list(range(len(good)))
    for index, response in good_answers.items():
        queries, k = good[index]
        assert response.status_code == 200, response.text
        for query, hits in zip(queries, response.json()["hits"]):
            assert [hit["id"] for hit in hits] == [hit.id for hit in expected[query][:k]]
            np.testing.assert_allclose(
                [hit["score"] for hit in hits], [hit.score for hit in expected[query][:k]], rtol=1e-4, atol=1e-5
            )
    assert sorted(bad_answers) == sorted((status, status) for _, status in bad)
    assert [response.status_code for response in poison_answers] == [500] * len(poisoned)
    assert all("poisoned batch" in response.json()["detail"] for response in poison_answers)
    assert stats.refused - refused_before == len(bad)


def test_client_refusals_are_one_line_and_not_retried(service, dense):
    url, stats = service
    client = RetrievalClient(url, retries=2)
    refused = stats.refused
    with pytest.raises(MapsTrainError) as too_large:
        client.search(["who"] * 3000, 5)
    assert str(too_large.value).startswith(
        f"retrieval service {url}/search: HTTP 413: queries: 3000 queries, over the limit of 2048 per request "
        "(--max-queries); the request is over a service limit"
    )
    with pytest.raises(MapsTrainError, match=r"/search: HTTP 422: k: Input should be greater than or equal to 1"):
        client.search(["who"], 0)
    assert "\n" not in str(too_large.value)
    assert stats.refused - refused == 2  # one request each: 4xx is never retried
    # a lone surrogate from a model's output is sent as U+FFFD instead of failing in the client
    hits = client.search([QUERIES[0] + "\ud800"], 3)
    assert [hit.id for hit in hits[0]] == [hit.id for hit in dense.search([QUERIES[0] + "\ufffd"], 3)[0]]


def test_serve_options_set_the_limits(monkeypatch):
    """`retrieve serve` defaults are `ServiceLimits`' own, and each option reaches the service."""
    from dataclasses import asdict

    import typer
    from typer.testing import CliRunner

    import maps_train.retrieval.service as service_module
    from maps_train.cli import app

    serve_command = typer.main.get_command(app).commands["retrieve"].commands["serve"]
    defaults = {param.name: param.default for param in serve_command.params}
    assert {name: defaults[name] for name in asdict(ServiceLimits())} == asdict(ServiceLimits())

    started = {}
    monkeypatch.setattr(service_module, "serve", lambda index, **kwargs: started.update(kwargs, index=index))
    result = CliRunner().invoke(app, ["retrieve", "serve", "--index", "idx", "--max-k", "7", "--max-hits", "70"])
    assert result.exit_code == 0, result.output
    assert started["limits"] == ServiceLimits(max_k=7, max_hits=70)
