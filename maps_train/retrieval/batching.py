"""The retrieval service's search queue: requests cut into slices, merged into bounded search calls, in a fair order.

One worker runs one `retriever.search` at a time in a thread (the search is CPU work; two at once only contend).
A call holds at most `max_batch` queries and `max_hits` queries x k (searched at the call's largest k), so no call
is long, and a request larger than that is cut into slices that go through successive calls. Each call is filled
in a fair order: the request served the fewest queries so far first (a new request has been served none), then the
one with the fewest queries left, then the oldest. Each waiting request first gets an equal share of the call
(`max_batch` / the requests waiting, at least one query, in that order), and what room is left goes to them in the
same order: two heavy requests share every call, and a one-query request waits for the call in flight and rides in
the next one, however many heavy requests wait (up to `max_batch` of them: beyond, the least served go first).

Each slice comes back to its request as one part (its hits, or their JSON when the request asked for JSON), and a
request whose `prefetch` parts are still waiting to be taken gets no further slice until one is: a client that does
not read its response stops its own search, and holds at most `prefetch` parts (plus the one being sent).

Should a call raise, each of its slices is re-run alone, so only the guilty request gets the error.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from maps_train.retrieval.base import Hit, Retriever

logger = logging.getLogger(__name__)

_END = object()  # the part after a job's last one


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0  # queries searched so far
    search_calls: int = 0
    largest_batch: int = 0  # queries in the largest single search call
    refused: int = 0  # requests answered 413/422: never queued, never searched
    dropped: int = 0  # requests whose body did not arrive (read timeout, client gone): one log line each
    unread: int = 0  # responses cut off because the client did not take a part within the send timeout
    cut: int = 0  # responses cut off because a later slice's search raised (the first part was already sent)
    isolated_batches: int = 0  # calls whose search raised and whose slices were re-run one at a time


@dataclass(eq=False)
class Job:
    """One request in the queue: its queries, how far it has been scheduled, and the parts waiting to be taken."""

    queries: list[str]
    k: int
    as_json: bool
    arrival: int
    scheduled: int = 0  # queries handed to a call so far (the next slice starts here)
    cancelled: bool = False
    parts: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)

    @property
    def left(self) -> int:
        return len(self.queries) - self.scheduled


def _fragment(hits: list[list[Hit]]) -> bytes:
    """The JSON of `hits` without the enclosing brackets: parts joined by commas make the `hits` array."""
    return json.dumps([[vars(hit) for hit in row] for row in hits], ensure_ascii=False, separators=(",", ":"))[
        1:-1
    ].encode()


class BatchingSearcher:
    """`submit(queries, k)` -> a `Job` whose parts `next_part` returns in order; `search(queries, k)` in one go."""

    def __init__(
        self,
        retriever: Retriever,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        max_hits: int = 2048,
        prefetch: int = 2,
    ):
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_hits = max_hits
        self.prefetch = prefetch
        self.stats = BatchStats()
        self._jobs: list[Job] = []
        self._arrivals = itertools.count()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass

    def submit(self, queries: list[str], k: int, as_json: bool = False) -> Job:
        assert self._wake is not None, "BatchingSearcher.start() was not awaited"
        job = Job(list(queries), k, as_json, next(self._arrivals))
        self.stats.requests += 1
        if queries:
            self._jobs.append(job)
            self._wake.set()
        else:
            job.parts.put_nowait(_END)
        return job

    async def next_part(self, job: Job) -> Any:
        """The job's next part (hits, or JSON bytes), None after the last; raises the error of a slice that failed."""
        part = await job.parts.get()
        self._wake.set()  # a part taken: the job may be ready for its next slice
        if part is _END:
            return None
        if isinstance(part, BaseException):
            raise part
        return part

    def cancel(self, job: Job) -> None:
        """Forget a job whose client went away: no further slice is searched, its waiting parts are dropped."""
        job.cancelled = True
        if job in self._jobs:
            self._jobs.remove(job)
        while not job.parts.empty():
            job.parts.get_nowait()

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        job = self.submit(queries, k)
        hits: list[list[Hit]] = []
        try:
            while (part := await self.next_part(job)) is not None:
                hits.extend(part)
        finally:
            self.cancel(job)
        return hits

    def _ready(self) -> list[Job]:
        return [job for job in self._jobs if job.left > 0 and job.parts.qsize() < self.prefetch]

    def _take(self) -> list[tuple[Job, int, int]]:
        """The next call's slices, `(job, start, end)`, in the fair order of the module docstring."""
        ready = sorted(self._ready(), key=lambda job: (job.scheduled, job.left, job.arrival))
        if not ready:
            return []
        share = max(1, self.max_batch // len(ready))
        counts: dict[int, int] = {}  # position in `ready` -> queries it gets in this call
        size, top_k = 0, 0
        for cap in (share, None):  # an equal share each, then the room left, in the same order
            for position, job in enumerate(ready):
                merged_k = max(top_k, job.k)
                room = min(self.max_batch - size, self.max_hits // merged_k - size)
                if size == 0:
                    room = max(room, 1)  # one query always goes, whatever its k
                have = counts.get(position, 0)
                count = min(room, job.left - have, cap if cap is not None else room)
                if count <= 0:
                    continue
                counts[position] = have + count
                size, top_k = size + count, merged_k
        slices = []
        for position in sorted(counts):
            job = ready[position]
            slices.append((job, job.scheduled, job.scheduled + counts[position]))
            job.scheduled += counts[position]
        return slices

    def _search(self, slices: list[tuple[Job, int, int]]) -> list[Any]:
        """In the worker thread: one search for every slice, each cut to its own k and encoded as its job asked."""
        queries = [query for job, start, end in slices for query in job.queries[start:end]]
        results = self.retriever.search(queries, max(job.k for job, _, _ in slices))
        parts, position = [], 0
        for job, start, end in slices:
            hits = [row[: job.k] for row in results[position : position + end - start]]
            position += end - start
            parts.append(_fragment(hits) if job.as_json else hits)
        return parts

    async def _call(self, slices: list[tuple[Job, int, int]]) -> list[Any]:
        size = sum(end - start for _, start, end in slices)
        self.stats.search_calls += 1
        self.stats.queries += size
        self.stats.largest_batch = max(self.stats.largest_batch, size)
        return await asyncio.to_thread(self._search, slices)

    def _deliver(self, job: Job, part: Any) -> None:
        if job.cancelled:
            return
        job.parts.put_nowait(part)
        if isinstance(part, BaseException):
            job.scheduled = len(job.queries)  # nothing more is searched for a failed request
        if job.left == 0 and job in self._jobs:
            self._jobs.remove(job)
            if not isinstance(part, BaseException):
                job.parts.put_nowait(_END)

    async def _gather(self) -> None:
        """Wait until some job is ready, then up to `max_wait_ms` for others to fill the call."""
        while not self._ready():
            self._wake.clear()
            await self._wake.wait()
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while sum(job.left for job in self._ready()) < self.max_batch:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                break

    async def _run(self) -> None:
        while True:
            await self._gather()
            slices = self._take()
            if not slices:
                continue
            try:
                parts = await self._call(slices)
            except Exception as err:
                logger.exception("search failed for a call of %d slices", len(slices))
                await self._search_alone(slices, err)
                continue
            for (job, _, _), part in zip(slices, parts):
                self._deliver(job, part)

    async def _search_alone(self, slices: list[tuple[Job, int, int]], error: Exception) -> None:
        """After a call raised: re-run each of its slices on its own, so only the guilty request fails."""
        if len(slices) == 1:
            self._deliver(slices[0][0], error)
            return
        self.stats.isolated_batches += 1
        for piece in slices:
            try:
                [part] = await self._call([piece])
            except Exception as err:
                logger.warning("search failed for a slice of %d queries: %s: %s", piece[2] - piece[1], *_named(err))
                part = err
            self._deliver(piece[0], part)


def _named(err: Exception) -> tuple[str, str]:
    return type(err).__name__, " ".join(str(err).split())[:300]
