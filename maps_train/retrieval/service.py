"""`maps-train retrieve serve`: the retrieval service (FastAPI under granian), searching concurrent requests fairly.

`POST /search {"queries": [...], "k": 5}` -> `{"hits": [[{id, title, text, score}, ...], ...]}`; `GET /health`
(also echoes the limits below and counts what was refused, dropped and cut in `stats`).

Requests go to `BatchingSearcher` (`batching.py`): one worker runs one search call at a time in a thread, each call
holding at most `--max-batch` queries and `--max-batch-hits` hits, merged from every waiting request in a fair order
(fewest queries served first), so a one-query request waits for the call in flight, never for the heavy requests
queued before it. The response is streamed part by part as the slices are searched: a client that does not read
stops its own search and holds at most a few parts of memory, and one that takes no part within `--send-timeout-s`
is cut off (one log line, `stats.unread`).

No client can take the service down (`ServiceLimits`, each a `retrieve serve` option):
- granian (a maintained Rust HTTP server; uvicorn has no header timeout, its keep-alive timer restarts on every
  byte) closes a connection whose request headers are not all in within `--header-timeout-s`, however it trickles
  them, and an idle keep-alive connection after that long too. At most `--max-connections` connections are served
  at once (granian's backpressure); more wait in the kernel's accept queue until one closes, never a 503.
- the body is read with a byte cap (`--max-body-bytes`, Content-Length checked before anything is read), then
  validated strictly by pydantic straight from the bytes (`k` a JSON integer, `queries` a list of JSON strings;
  a lone surrogate such as `"\\ud800"` is invalid JSON there), within `--max-queries`, `--max-query-chars`,
  `--max-k` and `--max-hits` (queries x k, which bounds the response). Over a limit: HTTP 413; malformed: 422; the
  one-line `detail` names the field, the limit and the option that sets it.
- a body not read whole within `--read-timeout-s` is dropped (HTTP 408, connection closed), and a client that goes
  away mid-body is dropped; each drop is one log line (never a traceback) and counted in /health's `stats.dropped`.
- only valid requests are searched; should a call's search raise, each of its slices is re-run alone, so only the
  guilty request gets the error: HTTP 500 if it was its first part, else its response is cut (`stats.cut`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.requests import ClientDisconnect

from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Retriever
from maps_train.retrieval.batching import BatchingSearcher, BatchStats, Job, _named

__all__ = ["BatchStats", "BatchingSearcher", "ServiceLimits", "create_app", "request_model", "serve"]

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
    # request headers not all in within this: the connection is closed (granian's http1 header_read_timeout), and
    # an idle keep-alive connection after this long too; a legal client sends its headers in one packet
    header_timeout_s: int = 5
    send_timeout_s: int = 30  # a client that takes no part of its response within this is cut off
    max_connections: int = 512  # connections served at once (granian's backpressure); more wait to be accepted

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


class HitsResponse(Response):
    """`{"hits": [...]}` streamed part by part as the searcher hands them over (an ASGI response of its own: the
    parts are JSON already, and each send has a deadline). A client that takes no part within `send_timeout_s`, or
    a later part whose search failed, ends the response early: the server then closes the connection, and the
    client sees a cut body rather than a valid one."""

    media_type = "application/json"

    def __init__(self, searcher: BatchingSearcher, job: Job, first: bytes, send_timeout_s: int, client: str):
        super().__init__(status_code=200)
        del self.headers["content-length"]  # the length is not known before the last part: chunked
        self.searcher, self.job, self.first, self.send_timeout_s, self.client = (
            searcher,
            job,
            first,
            send_timeout_s,
            client,
        )

    async def _send(self, send, body: bytes, more: bool) -> None:
        await asyncio.wait_for(
            send({"type": "http.response.body", "body": body, "more_body": more}), self.send_timeout_s
        )

    async def __call__(self, scope, receive, send) -> None:
        stats = self.searcher.stats
        try:
            await asyncio.wait_for(
                send({"type": "http.response.start", "status": 200, "headers": self.raw_headers}), self.send_timeout_s
            )
            await self._send(send, b'{"hits":[' + self.first, True)
            while True:
                try:
                    part = await self.searcher.next_part(self.job)
                except Exception as err:
                    stats.cut += 1
                    logger.warning(
                        "cut /search response to %s: a later slice failed: %s: %s", self.client, *_named(err)
                    )
                    return
                if part is None:
                    break
                await self._send(send, b"," + part, True)
            await self._send(send, b"]}", False)
        except TimeoutError:
            stats.unread += 1
            logger.warning(
                "cut /search response to %s: no part taken within %d s (%s)",
                self.client,
                self.send_timeout_s,
                _OPTION["send_timeout_s"],
            )
        except OSError as err:  # the client went away while a part was being sent (ASGI 2.4)
            logger.warning("cut /search response to %s: %s", self.client, type(err).__name__)
        finally:
            self.searcher.cancel(self.job)


def create_app(
    retriever: Retriever,
    max_batch: int = 32,
    max_wait_ms: float = 5.0,
    info: dict | None = None,
    limits: ServiceLimits | None = None,
    max_batch_hits: int = 2048,
):
    """The FastAPI app serving `retriever` within `limits`; `info` (e.g. from the manifest) is echoed by /health.
    `max_batch` and `max_batch_hits` bound each search call (`BatchingSearcher`)."""
    from contextlib import asynccontextmanager

    limits = limits or ServiceLimits()
    model = request_model(limits)
    searcher = BatchingSearcher(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms, max_hits=max_batch_hits)

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
    async def search(request: Request) -> Response:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        try:
            body = await asyncio.wait_for(read_body(request, limits.max_body_bytes), limits.read_timeout_s)
        except TimeoutError:
            searcher.stats.dropped += 1
            logger.warning(
                "dropped /search from %s: body not read within %d s (%s)",
                client,
                limits.read_timeout_s,
                _OPTION["read_timeout_s"],
            )
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
        job = searcher.submit(queries, k, as_json=True)
        try:
            first = await searcher.next_part(job)  # before the status line: a first slice that fails is a 500
        except Exception as err:
            searcher.cancel(job)
            return JSONResponse({"detail": "{}: {}".format(*_named(err))}, status_code=500)
        except BaseException:  # cancelled (the server shut the request down): forget the job
            searcher.cancel(job)
            raise
        return HitsResponse(searcher, job, first or b"", limits.send_timeout_s, client)

    return app


def _app_in_worker(index_dir: str, corpus: str | None, info: dict, settings: dict, limits: ServiceLimits):
    """The app, built in granian's worker process: the index is loaded there, once. The worker dies with granian's
    supervising process (Linux), so a killed service never leaves its index loaded and its port held."""
    import sys

    from maps_train.retrieval.factory import load_retriever

    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    try:
        retriever = load_retriever(index_dir, corpus=corpus)
    except (MapsTrainError, OSError) as err:  # a torn index: one line, not a traceback from the worker
        logger.error("retrieve serve: cannot load %s: %s: %s", index_dir, *_named(err))
        raise SystemExit(2) from None
    return create_app(retriever, info=info, limits=limits, **settings)


def serve(
    index_dir: str,
    host: str = "127.0.0.1",
    port: int = 8001,
    corpus: str | None = None,
    max_batch: int = 32,
    max_wait_ms: float = 5.0,
    limits: ServiceLimits | None = None,
    max_batch_hits: int = 2048,
) -> None:
    """Serve the index in `index_dir` (dense or BM25, from its manifest) under granian until interrupted: one
    worker process (the search is one CPU-bound queue) loads the index; this process only supervises it."""
    from functools import partial

    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    from maps_train.retrieval.manifest import read_manifest

    limits = limits or ServiceLimits()
    manifest = read_manifest(index_dir)  # a missing or torn index: one line here, before any worker starts
    info = {
        "kind": manifest["kind"],
        "count": manifest["count"],
        "index_dir": str(index_dir),
        "index_type": manifest["index"]["type"],
        "encoder": manifest.get("encoder", {}).get("name"),
    }
    settings = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_batch_hits": max_batch_hits}
    server = Server(
        "maps_train.retrieval.service:create_app",  # named in granian's log only: the loader below builds the app
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=1,
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,
        backpressure=limits.max_connections,
        http1_settings=HTTP1Settings(header_read_timeout=limits.header_timeout_s * 1000),
        log_level=LogLevels.info,
    )
    logger.info("serving %s on http://%s:%d", index_dir, host, port)
    try:
        server.serve(
            target_loader=partial(_app_in_worker, str(index_dir), corpus, info, settings, limits), wrap_loader=False
        )
    except SystemExit as exit_:
        if exit_.code:  # the worker did not start (its own line says why) or died
            raise MapsTrainError(
                f"retrieve serve: the service over {index_dir} stopped (see the lines above)"
            ) from None
        raise
