"""`maps-train retrieve serve`: the retrieval service (FastAPI), batching concurrent requests dynamically.

`POST /search {"queries": [...], "k": 5}` -> `{"hits": [[{id, title, text, score}, ...], ...]}`; `GET /health`.

Requests go into a queue; one background worker takes the first waiting request, gathers whatever else arrives
within `max_wait_ms` (up to `max_batch` queries), and runs ONE `search` for all of them in a worker thread, so
the event loop keeps accepting requests while the encoder and FAISS work, and the next batch forms meanwhile.
Many agents calling at once therefore cost a few large searches instead of queueing behind each other.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from maps_train.retrieval.base import Hit, Retriever

logger = logging.getLogger(__name__)

MAX_K = 1000


class SearchRequest(BaseModel):
    queries: list[str]
    k: int = Field(5, ge=1, le=MAX_K)


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


class BatchingSearcher:
    """Merges concurrent `search` calls into single `retriever.search` calls (one worker, one call at a time)."""

    def __init__(self, retriever: Retriever, max_batch: int = 256, max_wait_ms: float = 5.0):
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None

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
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        size = len(batch[0].queries)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            remaining = deadline - loop.time()
            try:
                item = (
                    self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self._queue.get(), remaining)
                )
            except (TimeoutError, asyncio.QueueEmpty):
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            queries = [query for item in batch for query in item.queries]
            k = max(item.k for item in batch)
            self.stats.requests += len(batch)
            self.stats.queries += len(queries)
            self.stats.search_calls += 1
            self.stats.largest_batch = max(self.stats.largest_batch, len(queries))
            try:
                results = await asyncio.to_thread(self.retriever.search, queries, k)
            except Exception as err:  # every waiting request gets the error, the worker carries on
                logger.exception("search failed for a batch of %d queries", len(queries))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(err)
                continue
            position = 0
            for item in batch:
                mine = results[position : position + len(item.queries)]
                position += len(item.queries)
                if not item.future.done():  # the client may have gone away
                    item.future.set_result([hits[: item.k] for hits in mine])


def create_app(retriever: Retriever, max_batch: int = 256, max_wait_ms: float = 5.0, info: dict | None = None):
    """The FastAPI app serving `retriever`; `info` (e.g. from the manifest) is echoed by /health."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, HTTPException

    searcher = BatchingSearcher(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await searcher.start()
        yield
        await searcher.stop()

    app = FastAPI(title="maps-train retrieval", lifespan=lifespan)
    app.state.searcher = searcher

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **(info or {}), "stats": vars(searcher.stats)}

    @app.post("/search")
    async def search(request: SearchRequest) -> JSONResponse:
        try:
            results = await searcher.search(request.queries, request.k)
        except Exception as err:
            raise HTTPException(status_code=500, detail=f"{type(err).__name__}: {err}") from None
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
    app = create_app(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms, info=info)
    logger.info("serving %s on http://%s:%d", index_dir, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")
