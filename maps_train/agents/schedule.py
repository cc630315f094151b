"""How a run advances its questions: in batched steps, or each question on its own (`agent.schedule`).

- `step`: a chunk of `agent.batch_size` questions goes through `Engine.run_batch` together: each step sends ONE
  backend call with the pending calls of every active question and ONE search with all their sub-queries, so every
  question waits for the slowest completion of the step. A chunk's answers are written when the chunk is done.
- `continuous`: up to `agent.concurrency` questions run at once, each on its own thread through the very same
  engine code (`run_batch([question])`: same prompts, parsing, traces and stop rules), so a question's writer
  calls go out right after its own proposer returns. Calls meet in a backend that batches continuously (vLLM's
  engine loop, a `vllm serve` fleet through the async client); searches of all questions meet in a
  `CoalescingRetriever`, which merges whatever arrives within a few milliseconds into one batched search.
  A backend that runs one call at a time (HF, test doubles) is wrapped in a `CoalescingBackend` the same way.
  Each question is written the moment it finishes, so a kill loses only the questions in flight.
- `auto` (the default): continuous when every engine behind the router is concurrent (vLLM, openai), else step.

When each wins: continuous removes the wait for the step's slowest completion and the idle engine between
steps, which is most of the time when completions vary in length or questions stop at different rounds; step
can match it on a backend without continuous batching (HF), where calls queue behind each other anyway.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from maps_train.errors import MapsTrainError
from maps_train.llm.types import Backend, ChatRequest, Completion
from maps_train.questions import Question
from maps_train.records.trace import TraceRecord
from maps_train.retrieval.base import Hit, Retriever

if TYPE_CHECKING:
    from maps_train.agents.engine import Engine

_STOP = object()


class Coalescer:
    """Calls `fn(items) -> results` (one result per item, in order) for lists submitted from many threads, merging
    what arrives within `max_wait_s` of the first waiting list (up to `max_items`) into one call, on one worker
    thread: the wrapped function is only ever called from that thread, one call at a time."""

    def __init__(self, fn: Callable[[list], list], max_wait_s: float, max_items: int = 4096, name: str = "coalescer"):
        self.fn = fn
        self.max_wait_s = max_wait_s
        self.max_items = max_items
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, items: list) -> list:
        if not items:
            return []
        future: Future = Future()
        self._inbox.put((list(items), future))
        return future.result()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker once what is queued is done; wait at most `timeout_s` for it (a call stuck in a backend
        that stalls must not hold up the command: the thread is a daemon and ends with the process)."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            first = self._inbox.get()
            if first is _STOP:
                return
            batch, size, stop = [first], len(first[0]), False
            deadline = time.monotonic() + self.max_wait_s
            while size < self.max_items:
                try:
                    item = self._inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
                size += len(item[0])
            self._flush(batch)
            if stop:
                return

    def _flush(self, batch: list[tuple[list, Future]]) -> None:
        merged = [x for items, _ in batch for x in items]
        try:
            results = self.fn(merged)
            if len(results) != len(merged):
                raise RuntimeError(f"{self._thread.name}: {len(results)} results for {len(merged)} items")
        except BaseException as err:  # noqa: BLE001 - every waiting caller hears of it
            for _, future in batch:
                future.set_exception(err)
            return
        position = 0
        for items, future in batch:
            future.set_result(results[position : position + len(items)])
            position += len(items)


class CoalescingBackend:
    """A backend that takes one call at a time, shared by question threads: their calls merge into one."""

    concurrent = True

    def __init__(self, inner: Backend, max_wait_s: float = 0.02):
        self.inner = inner
        self._coalescer = Coalescer(inner.generate, max_wait_s, name="coalescing-backend")

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return self._coalescer.call(requests)

    def close(self) -> None:
        self._coalescer.close()

    def __getattr__(self, name: str) -> Any:  # routes, route(), ... of the wrapped router
        return getattr(self.inner, name)


class CoalescingRetriever:
    """The retrieval layer's dynamic batching for question threads: concurrent searches merge into one call
    (per `k`), identical query strings searched once."""

    def __init__(self, inner: Retriever, max_wait_s: float = 0.005):
        self.inner = inner
        self.max_wait_s = max_wait_s
        self._by_k: dict[int, Coalescer] = {}
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        with self._lock:
            if k not in self._by_k:
                self._by_k[k] = Coalescer(lambda qs, k=k: self._search_unique(qs, k), self.max_wait_s,
                                          name=f"coalescing-search-k{k}")
            coalescer = self._by_k[k]
        return coalescer.call(queries)

    def _search_unique(self, queries: list[str], k: int) -> list[list[Hit]]:
        unique = list(dict.fromkeys(queries))
        by_query = dict(zip(unique, self.inner.search(unique, k)))
        return [by_query[query] for query in queries]

    def close(self) -> None:
        for coalescer in self._by_k.values():
            coalescer.close()
        # each coalescer's function refers back to self: without this, that cycle keeps `inner` (a whole index)
        # alive after the run until the cyclic garbage collector happens to run
        self._by_k.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def coalesced(engine: Engine) -> Iterator[None]:
    """For the duration: the engine's searches (and, unless its backend takes concurrent calls, its backend calls)
    go through coalescers, so its questions can run on threads of their own."""
    backend, retriever = engine.backend, engine.retriever
    owned: list[Any] = [CoalescingRetriever(retriever)]
    engine.retriever = owned[0]
    if not getattr(backend, "concurrent", False):
        owned.append(CoalescingBackend(backend))
        engine.backend = owned[-1]
    try:
        yield
    finally:
        engine.backend, engine.retriever = backend, retriever
        for coalescer in owned:
            coalescer.close()


def advance(
    engine: Engine,
    questions: list[Question],
    on_done: Callable[[TraceRecord], None],
    schedule: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> str:
    """Run `questions` through `engine` by `schedule` (default `agent.schedule`), calling `on_done(trace)` for
    each as it is done (continuous: the moment it finishes; step: when its chunk does). Returns the schedule run."""
    agent = engine.agent
    schedule = resolve_schedule(schedule or agent.schedule, engine.backend)
    if schedule == "continuous":
        concurrency = agent.concurrency or agent.batch_size
        if concurrency < 1:
            raise MapsTrainError(f"agent.concurrency: must be at least 1, got {concurrency}")
        with coalesced(engine):
            run_continuous(lambda question: engine.run_batch([question])[0], questions, concurrency, on_done)
        return schedule
    if on_step is not None:
        engine.on_step = on_step
    batch_size = max(1, agent.batch_size)
    for start in range(0, len(questions), batch_size):
        for trace in engine.run_batch(questions[start : start + batch_size]):
            on_done(trace)
    return schedule


def run_all(engine: Engine, questions: list[Question], schedule: str | None = None) -> list[TraceRecord]:
    """Every question's trace, in input order, by `schedule` (for callers that want them all at once)."""
    done: dict[str, TraceRecord] = {}
    advance(engine, questions, lambda trace: done.__setitem__(trace.question_id, trace), schedule)
    return [done[question.id] for question in questions]


def resolve_schedule(schedule: str, backend: Any) -> str:
    """`auto` -> continuous when the backend takes concurrent calls, else step."""
    if schedule != "auto":
        return schedule
    return "continuous" if getattr(backend, "concurrent", False) else "step"


def run_continuous(
    run_one: Callable[[Question], TraceRecord],
    questions: Iterable[Question],
    concurrency: int,
    on_done: Callable[[TraceRecord], None],
) -> None:
    """`run_one` for every question on up to `concurrency` threads; `on_done(trace)` on this thread, in the
    order questions finish. The first error stops the run: questions not started are dropped and the error is
    raised at once (questions still in flight finish or fail on their own threads; nothing of theirs is written).

    The question threads are daemon threads that nobody joins: a thread still waiting on a backend that stalls
    or is gone must not keep the command alive once it has failed (an executor's threads are joined when the
    interpreter exits, so a stalled call hung the process after its error line)."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    count = 0
    for question in questions:
        todo.put(question)
        count += 1
    finished: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                question = todo.get_nowait()
            except queue.Empty:
                return
            try:
                finished.put((run_one(question), None))
            except BaseException as err:  # noqa: BLE001 - raised on the calling thread
                finished.put((None, err))
                return

    for number in range(min(max(1, concurrency), count)):
        threading.Thread(target=work, name=f"question-{number}", daemon=True).start()
    try:
        for _ in range(count):
            trace, err = finished.get()
            if err is not None:
                raise err
            on_done(trace)
    finally:
        stop.set()
