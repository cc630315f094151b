"""One thread that owns a `vllm.LLM` and steps it continuously, so calls from many threads share its batch.

`LLM.generate` adds a list of prompts and steps the engine until every one of them is done: a caller that
submits while another waits must wait for the whole first list. `EngineLoop` keeps the engine running instead:
any thread may `submit` prompts at any time (vLLM's public `LLM.enqueue`), the loop thread steps the engine
(`LLMEngine.step`, reached through `llm.vllm_internals`) while it has unfinished requests, and each request's future is resolved the step it
finishes. New requests join the running batch at the next step (vLLM's continuous batching), so an agent
question whose proposer just returned sends its writers while other questions are still decoding.

Only the loop thread touches the engine. An error while adding a submission fails that submission's futures; an
error while stepping fails every waiting future and ends the loop (the next submit reports it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.vllm_internals import llm_engine, output_request_id

_STOP = object()


@dataclass
class Finished:
    """A request's final output and how long it took from submission to its last token."""

    output: Any  # vllm.RequestOutput
    latency_s: float


@dataclass
class _Submission:
    prompts: list[Any]
    params: list[Any]
    loras: list[Any]
    futures: list[Future] = field(default_factory=list)
    submitted: float = field(default_factory=time.perf_counter)


class EngineLoop:
    def __init__(self, llm: Any, name: str = "vllm-engine-loop"):
        self.llm = llm
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: dict[str, tuple[Future, float]] = {}  # request id -> (future, submission time)
        self._error: BaseException | None = None
        self.steps = 0  # engine steps taken (for benchmarks)
        self.peak_running = 0  # the most requests in flight at once
        # Seconds spent in engine steps, by requests in flight (the power of two at or below the count): where the
        # engine ran with a small batch. Wall time minus their sum is time the engine sat idle.
        self.step_seconds: Counter[int] = Counter()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, prompts: list[Any], params: list[Any], loras: list[Any]) -> list[Future]:
        """Queue prompts (with their `SamplingParams` and `LoRARequest`s); one future of `Finished` per prompt."""
        if self._error is not None or not self._thread.is_alive():
            raise MapsTrainError(f"the vLLM engine loop has stopped ({self._error or 'closed'})")
        job = _Submission(list(prompts), list(params), list(loras))
        job.futures = [Future() for _ in job.prompts]
        self._inbox.put(job)
        return job.futures

    def generate(self, prompts: list[Any], params: list[Any], loras: list[Any]) -> list[Finished]:
        """Submit and wait: the outputs in prompt order."""
        return [future.result() for future in self.submit(prompts, params, loras)]

    def close(self) -> None:
        """Stop the loop (requests still waiting fail); the engine itself is the caller's to shut down."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout=60)

    # -- the loop thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        engine = llm_engine(self.llm)
        try:
            while True:
                busy = engine.has_unfinished_requests()
                if not self._take(block=not busy):
                    return
                if not engine.has_unfinished_requests():
                    continue
                running = len(self._waiting)
                self.peak_running = max(self.peak_running, running)
                started = time.perf_counter()
                outputs = engine.step()
                self.steps += 1
                now = time.perf_counter()
                self.step_seconds[1 << (running.bit_length() - 1) if running else 0] += now - started
                for output in outputs:
                    if output.finished and output.request_id in self._waiting:
                        future, submitted = self._waiting.pop(output.request_id)
                        future.set_result(Finished(output, now - submitted))
        except BaseException as err:  # noqa: BLE001 - every waiter must hear of it, then the loop ends
            self._error = err
            self._fail_all(err)
        finally:
            self._fail_all(MapsTrainError("the vLLM engine loop was closed with requests still running"))

    def _take(self, block: bool) -> bool:
        """Add every queued submission to the engine (waiting for one when the engine is idle); False on stop."""
        while True:
            try:
                job = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if job is _STOP:
                return False
            block = False
            try:
                ids = self.llm.enqueue(job.prompts, job.params, lora_request=job.loras, use_tqdm=False)
            except Exception as err:  # noqa: BLE001 - this submission fails; the others go on
                for future in job.futures:
                    future.set_exception(err)
                continue
            for request_id, future in zip(ids, job.futures):
                self._waiting[output_request_id(request_id)] = (future, job.submitted)

    def _fail_all(self, err: BaseException) -> None:
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(err)
        self._waiting.clear()
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if job is not _STOP:
                for future in job.futures:
                    future.set_exception(err)
