"""vLLM's `AsyncLLM` (the engine `vllm serve` runs on) as the in-process engine driver of `VLLMBackend`.

`AsyncEngineLoop` gives the backend what `vllm_loop.EngineLoop` gives it (`submit`, `generate`, `close`,
`peak_running`, `step_seconds`), so prompt rendering, LoRA requests, structured outputs, the reasoning parser,
per-request sampling and the `Completion` with its cost stay in `vllm_backend.py`, shared by both drivers
(`backend.vllm_engine`: "loop" or "async").

`AsyncLLM` lives on an asyncio loop: this module runs one event loop in its own thread, creates the engine on it,
and the agents' threads hand it their prompts with `asyncio.run_coroutine_threadsafe`. A submission's prompts are
added in their order by one task on that loop (as `LLM.enqueue` adds them), each through `AsyncLLM.generate` with
its own request id, and each request's `concurrent.futures.Future` is resolved when its final output arrives.
The engine's steps run in vLLM's engine-core process, out of sight: `step_seconds` stays empty here.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.vllm_loop import Finished


def async_engine_args(llm_kwargs: dict[str, Any]):
    """The `AsyncEngineArgs` of the engine `vllm.LLM(**llm_kwargs)` would start: `LLM` turns a
    `structured_outputs_config` dict into its config class and logs no stats unless told to; every other
    keyword is an engine argument of the same name and default."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = dict(llm_kwargs)
    kwargs.setdefault("disable_log_stats", True)
    if isinstance(kwargs.get("structured_outputs_config"), dict):
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    return AsyncEngineArgs(**kwargs)


class AsyncEngineLoop:
    def __init__(self, llm_kwargs: dict[str, Any], name: str = "vllm-async-loop"):
        """Start an event loop thread and an `AsyncLLM` on it from the keywords `vllm.LLM` would take."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._request_ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()  # requests in flight (touched on the loop thread only)
        self._closed = False
        self.peak_running = 0  # the most requests in flight at once
        self.step_seconds: Counter[int] = Counter()  # the engine core steps in its own process: not seen here
        try:
            self.engine = self._call(self._start(async_engine_args(llm_kwargs)))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _start(engine_args):
        """Created on the loop, so that its output handler starts here. `LLM_CLASS`: the scheduler defaults
        (max_num_seqs, batched tokens) of `vllm.LLM`, so both drivers run the same engine."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args, usage_context=UsageContext.LLM_CLASS)

    def _call(self, coroutine) -> Any:
        """Run a coroutine on the loop thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # -- what the backend calls (any thread) -------------------------------------------------------------

    def submit(self, prompts: list[Any], params: list[Any], loras: list[Any]) -> list[Future]:
        """Queue prompts (with their `SamplingParams` and `LoRARequest`s); one future of `Finished` per prompt."""
        engine = self.engine
        if self._closed or engine is None or not self._thread.is_alive():
            raise MapsTrainError("the vLLM async engine has stopped (closed)")
        if engine.errored:
            raise MapsTrainError(f"the vLLM async engine has stopped ({engine.dead_error})")
        futures = [Future() for _ in prompts]
        submitted = time.perf_counter()
        self._loop.call_soon_threadsafe(self._add, list(prompts), list(params), list(loras), futures, submitted)
        return futures

    def generate(self, prompts: list[Any], params: list[Any], loras: list[Any]) -> list[Finished]:
        """Submit and wait: the outputs in prompt order."""
        return [future.result() for future in self.submit(prompts, params, loras)]

    def get_tokenizer(self):
        return self.engine.get_tokenizer()

    def reset_prefix_cache(self) -> None:
        self._call(self.engine.reset_prefix_cache())

    def close(self) -> None:
        """Fail the requests still waiting, shut the engine down (its core process exits), stop the loop, join
        its thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._call(self._shutdown())
            finally:
                self._stop_loop()
        self.engine = None  # shut down; without it, AsyncLLM.__del__ would shut down again at interpreter exit

    # -- the loop thread ---------------------------------------------------------------------------------

    def _add(self, prompts, params, loras, futures, submitted) -> None:
        """Start one task per prompt, in prompt order: each registers its request before its first await, so
        the engine receives them in this order."""
        for prompt, param, lora, future in zip(prompts, params, loras, futures):
            task = self._loop.create_task(self._request(prompt, param, lora, future, submitted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.peak_running = max(self.peak_running, len(self._tasks))

    async def _request(self, prompt, params, lora, future: Future, submitted: float) -> None:
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind

        try:
            # Rendered here, as `LLM` renders it; a rendered input is added without a trip to a worker thread.
            renderer = self.engine.renderer
            (engine_input,) = renderer.render_cmpl(
                [parse_model_prompt(self.engine.model_config, prompt)], renderer.default_cmpl_tok_params
            )
            params.output_kind = RequestOutputKind.FINAL_ONLY  # as `LLM` sets it: only the last output is wanted
            request_id = str(next(self._request_ids))
            outputs = [out async for out in self.engine.generate(engine_input, params, request_id, lora_request=lora)]
            if not future.done():
                future.set_result(Finished(outputs[-1], time.perf_counter() - submitted))
        except asyncio.CancelledError:
            if not future.done():
                future.set_exception(MapsTrainError("the vLLM async engine was closed with requests still running"))
            raise
        except Exception as err:  # noqa: BLE001 - this request fails; the others go on
            if not future.done():
                future.set_exception(err)

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.engine.shutdown()
        # the engine's own tasks (its output handler, the core client's queue reader), cancelled by shutdown
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)
        if not self._thread.is_alive():
            self._loop.close()
