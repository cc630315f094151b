"""`maps-train retrieve serve`: the retrieval service (FastAPI), batching concurrent requests dynamically.

`POST /search {"queries": [...], "k": 5}` -> `{"hits": [[{id, title, text, score}, ...], ...]}`; `GET /health`
(also echoes the limits below).

Requests go into a queue; one background worker takes the first waiting request, gathers whatever else arrives
within `max_wait_ms` (up to `max_batch` queries), and runs ONE `search` for all of them in a worker thread, so
the event loop keeps accepting requests while the encoder and FAISS work, and the next batch forms meanwhile.
Many agents calling at once therefore cost a few large searches instead of queueing behind each other.

No request can take the service down (`ServiceLimits`, each a `retrieve serve` option):
- the body is read with a byte cap (`--max-body-bytes`, Content-Length checked before anything is read), then
  validated strictly by pydantic straight from the bytes (`k` a JSON integer, `queries` a list of JSON strings;
  a lone surrogate such as `"\\ud800"` is invalid JSON there), within `--max-queries`, `--max-query-chars`,
  `--max-k` and `--max-hits` (queries x k, which bounds the response). Over a limit: HTTP 413; malformed: 422; the
  one-line `detail` names the field, the limit and the option that sets it.
- a body not read whole within `--read-timeout-s` is dropped (HTTP 408, connection closed), and a client that goes
  away mid-body is dropped; each drop is one log line (never a traceback) and counted in /health's `stats.dropped`.
  At most `--max-connections` connections and requests are served at once (uvicorn's `limit_concurrency`; more are
  answered 503 at once).
- only valid requests join a batch, and a merged search never holds more than `max_hits` hits; should a batch's
  search still raise, each of its requests is re-run alone, so only the guilty one gets the error (HTTP 500).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.requests import ClientDisconnect

from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Hit, Retriever

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceLimits:
    """What one `/search` request may ask for. The defaults fit the agents (a step of 64 questions x 3
    directions at k=5 is 960 hits) and recall@k runs, and keep one request to a few MB of memory."""

    max_queries: int = 2048  # queries in one request
    max_k: int = 1000  # hits per query
    max_query_chars: int = 2048  # characters in one query (encoders keep 512 tokens at most anyway)
    # queries x k in one request; the response is this many hits x the corpus's JSON bytes per hit: 620 B on
    # average over ../shared/realdata's corpus (86 words a passage: 20 MB at 32768 hits), 2.4 KB at its 99th
    # percentile (79 MB); lower it for a corpus of long passages
    max_hits: int = 32768
    max_body_bytes: int = 2 * 1024 * 1024  # the request body, read before any JSON is parsed
    read_timeout_s: int = 10  # a body not read whole within this is dropped (408): a slow or stalled sender
    max_connections: int = 512  # connections and requests at once (uvicorn's limit_concurrency; more get 503)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MapsTrainError(f"service limit {name}: expected a positive integer, got {value!r}")


# The `retrieve serve` option that sets each limit, named in every refusal so the operator knows what to raise.
_OPTION = {name: "--" + name.replace("_", "-") for name in ServiceLimits.__dataclass_fields__}


class RequestRefused(Exception):
    """A request the service will not run: `status` 413 (over a limit) or 422 (malformed); `detail` one line."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def request_model(limits: ServiceLimits) -> type[BaseModel]:
    """The `/search` body as a strict pydantic model bounded by `limits` (no coercion: `"3"` and `true` are not k)."""

    class SearchRequest(BaseModel):
        # strict: no coercion; pydantic also refuses a lone surrogate in a str (the encoder's tokenizer raises on one)
        model_config = ConfigDict(strict=True, extra="forbid")
        queries: list[Annotated[str, StringConstraints(max_length=limits.max_query_chars)]] = Field(
            max_length=limits.max_queries
        )
        k: int = Field(5, ge=1, le=limits.max_k)

    return SearchRequest


def _described(value: Any) -> str:
    """A JSON value as `type value` for an error line (`string "3"`, `boolean true`); containers by type only."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    kind = "null" if value is None else names.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)) or value is None:
        return kind
    shown = json.dumps(value, ensure_ascii=True)
    return f"{kind} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def _refusal(error: dict[str, Any], limits: ServiceLimits) -> RequestRefused:
    """One pydantic error as a one-line refusal: 413 with the limit and its option when a bound was passed."""
    where = ".".join(str(part) for part in error["loc"]) or "body"
    if len(error["loc"]) == 2:  # ("queries", index)
        where = f"queries[{error['loc'][1]}]"
    kind = error["type"]
    if kind == "too_long" and where == "queries":
        count = error["ctx"]["actual_length"]
        detail = f"{count} queries, over the limit of {limits.max_queries} per request"
        return RequestRefused(413, f"queries: {detail} ({_OPTION['max_queries']})")
    if kind == "string_too_long":
        detail = f"{len(error['input'])} characters, over the limit of {limits.max_query_chars}"
        return RequestRefused(413, f"{where}: {detail} ({_OPTION['max_query_chars']})")
    if kind == "less_than_equal" and where == "k":
        return RequestRefused(413, f"k: {error['input']}, over the limit of {limits.max_k} ({_OPTION['max_k']})")
    if kind == "json_invalid":
        reason = error["ctx"]["error"]
        hint = " (a lone surrogate escape such as \\ud800?)" if "escape" in reason or "code point" in reason else ""
        return RequestRefused(422, f"body: invalid JSON: {reason}{hint}")
    if kind == "extra_forbidden":
        return RequestRefused(422, f"{where}: unknown field (a request has `queries` and `k`)")
    got = "" if kind == "missing" else f", got {_described(error.get('input'))}"
    return RequestRefused(422, f"{where}: {error['msg']}{got}")


def parse_request(body: bytes, model: type[BaseModel], limits: ServiceLimits) -> tuple[list[str], int]:
    """`(queries, k)` from a `/search` body, or `RequestRefused` naming the first field at fault."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as err:
        raise _refusal(err.errors(include_url=False)[0], limits) from None
    hits = len(request.queries) * request.k
    if hits > limits.max_hits:
        detail = f"{len(request.queries)} x {request.k} = {hits} hits, over the limit of {limits.max_hits} per request"
        raise RequestRefused(413, f"queries x k: {detail} ({_OPTION['max_hits']})")
    return request.queries, request.k


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed `max_bytes`: by its Content-Length before
    reading a byte, else (chunked) once the chunks read so far pass the cap, so a huge body is never held."""
    too_large = RequestRefused(413, f"body: over the limit of {max_bytes} bytes ({_OPTION['max_body_bytes']})")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestRefused(422, f"body: Content-Length {declared[:40]!r} is not a byte count")
        if int(declared) > max_bytes:
            raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    search_calls: int = 0
    largest_batch: int = 0  # queries in the largest single search call
    refused: int = 0  # requests answered 413/422: never queued, never searched
    dropped: int = 0  # requests whose body did not arrive (read timeout, client gone): one log line each
    isolated_batches: int = 0  # batches whose search raised and whose requests were re-run one at a time


class BatchingSearcher:
    """Merges concurrent `search` calls into single `retriever.search` calls (one worker, one call at a time).

    A batch holds at most `max_batch` queries (more only when one request alone has more) and, since it is
    searched at its largest `k`, at most `max_hits` queries x k: one request with a large k never turns many
    small requests into a huge search.
    """

    def __init__(
        self,
        retriever: Retriever,
        max_batch: int = 256,
        max_wait_ms: float = 5.0,
        max_hits: int = ServiceLimits.max_hits,
    ):
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_hits = max_hits
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._backlog: list[_Pending] = []  # taken from the queue, waiting for a batch (oldest first)
        self._smallest_next = False  # batches start alternately with the oldest and the smallest waiting request

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        assert self._queue is not None, "BatchingSearcher.start() was not awaited"
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(list(queries), k, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        """The next batch. Requests that wait are a backlog, not a line: batches start alternately with the
        request that has waited longest and with the smallest one waiting, so a one-query request waits for at
        most one heavy search, never for every heavy request queued before it, and a heavy one is never passed
        over twice in a row. The batch then takes waiting requests smallest first, then what arrives within
        `max_wait_ms`, while it fits (`max_batch` queries, `max_hits` hits)."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while not self._queue.empty():
            self._backlog.append(self._queue.get_nowait())
        if not self._backlog:
            self._backlog.append(await self._queue.get())
        if self._smallest_next:
            first = min(self._backlog, key=lambda item: len(item.queries) * item.k)
        else:
            first = self._backlog[0]
        self._smallest_next = not self._smallest_next
        self._backlog.remove(first)
        batch, size, k = [first], len(first.queries), first.k

        def fits(item: _Pending) -> bool:
            merged_size, merged_k = size + len(item.queries), max(k, item.k)
            return merged_size <= self.max_batch and merged_size * merged_k <= self.max_hits

        for item in sorted(self._backlog, key=lambda item: len(item.queries) * item.k):
            if size >= self.max_batch:
                break
            if fits(item):
                self._backlog.remove(item)
                batch.append(item)
                size, k = size + len(item.queries), max(k, item.k)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            remaining = deadline - loop.time()
            try:
                item = (
                    self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self._queue.get(), remaining)
                )
            except (TimeoutError, asyncio.QueueEmpty):
                break
            if not fits(item):
                self._backlog.append(item)  # it waits for a later batch
                continue
            batch.append(item)
            size, k = size + len(item.queries), max(k, item.k)
        return batch

    async def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.stats.search_calls += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(queries))
        return await asyncio.to_thread(self.retriever.search, queries, k)

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            queries = [query for item in batch for query in item.queries]
            self.stats.requests += len(batch)
            self.stats.queries += len(queries)
            try:
                results = await self._search(queries, max(item.k for item in batch))
            except Exception as err:
                logger.exception("search failed for a batch of %d requests (%d queries)", len(batch), len(queries))
                await self._search_alone(batch, err)
                continue
            position = 0
            for item in batch:
                mine = results[position : position + len(item.queries)]
                position += len(item.queries)
                if not item.future.done():  # the client may have gone away
                    item.future.set_result([hits[: item.k] for hits in mine])

    async def _search_alone(self, batch: list[_Pending], error: Exception) -> None:
        """After a batch's search raised: re-run each of its requests on its own, so only the guilty one fails."""
        if len(batch) == 1:
            if not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        self.stats.isolated_batches += 1
        for item in batch:
            try:
                outcome = await self._search(item.queries, item.k)
            except Exception as err:
                logger.warning("search failed for a request of %d queries: %s: %s", len(item.queries), *_named(err))
                if not item.future.done():
                    item.future.set_exception(err)
                continue
            if not item.future.done():
                item.future.set_result(outcome)


def _named(err: Exception) -> tuple[str, str]:
    return type(err).__name__, " ".join(str(err).split())[:300]


def create_app(
    retriever: Retriever,
    max_batch: int = 256,
    max_wait_ms: float = 5.0,
    info: dict | None = None,
    limits: ServiceLimits | None = None,
):
    """The FastAPI app serving `retriever` within `limits`; `info` (e.g. from the manifest) is echoed by /health."""
    from contextlib import asynccontextmanager

    limits = limits or ServiceLimits()
    model = request_model(limits)
    searcher = BatchingSearcher(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms, max_hits=limits.max_hits)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await searcher.start()
        yield
        await searcher.stop()

    app = FastAPI(title="maps-train retrieval", lifespan=lifespan)
    app.state.searcher = searcher

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **(info or {}), "limits": asdict(limits), "stats": vars(searcher.stats)}

    # The body is read and validated here rather than by a FastAPI body parameter: FastAPI would read all of it
    # first, with no size cap, and its json.loads lets lone surrogates through. The schema still goes to /docs.
    schema = {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}

    @app.post("/search", openapi_extra=schema)
    async def search(request: Request) -> JSONResponse:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        try:
            body = await asyncio.wait_for(read_body(request, limits.max_body_bytes), limits.read_timeout_s)
        except TimeoutError:
            searcher.stats.dropped += 1
            logger.warning("dropped /search from %s: body not read within %d s (%s)", client, limits.read_timeout_s,
                           _OPTION["read_timeout_s"])
            detail = f"body: not read within {limits.read_timeout_s} s ({_OPTION['read_timeout_s']})"
            return JSONResponse({"detail": detail}, status_code=408, headers={"Connection": "close"})
        except ClientDisconnect:
            searcher.stats.dropped += 1
            logger.warning("dropped /search from %s: the client went away before its body was read", client)
            return JSONResponse({"detail": "client went away"}, status_code=400)
        except RequestRefused as refusal:
            searcher.stats.refused += 1
            return JSONResponse({"detail": refusal.detail}, status_code=refusal.status)
        try:
            queries, k = parse_request(body, model, limits)
        except RequestRefused as refusal:
            searcher.stats.refused += 1
            return JSONResponse({"detail": refusal.detail}, status_code=refusal.status)
        try:
            results = await searcher.search(queries, k)
        except Exception as err:
            raise HTTPException(status_code=500, detail="{}: {}".format(*_named(err))) from None
        # a plain JSONResponse skips FastAPI's jsonable_encoder, a slow walk over every hit
        return JSONResponse({"hits": [[vars(hit) for hit in hits] for hits in results]})

    return app


def serve(
    index_dir: str,
    host: str = "127.0.0.1",
    port: int = 8001,
    corpus: str | None = None,
    max_batch: int = 256,
    max_wait_ms: float = 5.0,
    limits: ServiceLimits | None = None,
) -> None:
    """Load the index in `index_dir` (dense or BM25, from its manifest) and serve it until interrupted."""
    import uvicorn

    from maps_train.retrieval.factory import load_retriever

    retriever = load_retriever(index_dir, corpus=corpus)
    manifest = retriever.manifest
    info = {
        "kind": manifest["kind"],
        "count": manifest["count"],
        "index_dir": str(index_dir),
        "index_type": manifest["index"]["type"],
        "encoder": manifest.get("encoder", {}).get("name"),
    }
    app = create_app(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms, info=info, limits=limits)
    logger.info("serving %s on http://%s:%d", index_dir, host, port)
    limits = limits or ServiceLimits()
    uvicorn.run(app, host=host, port=port, log_level="info", limit_concurrency=limits.max_connections)
