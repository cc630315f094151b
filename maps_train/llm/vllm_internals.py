"""Every place maps-train reaches inside vLLM, past its public API, in one module (TRL's: `train/internals.py`).

Each is a name a minor release may move, so each is used through a function here (vLLM is pinned per machine set,
`pyproject.toml`), and `tests/test_internals.py` fails on any such access elsewhere in the package.

- The engine an `LLM` steps (`LLM.llm_engine`): `EngineLoop` steps it itself, so calls from many threads share
  one batch; the ids `LLM.enqueue` returns are vLLM's internal ones, mapped back to the ids outputs carry.
- The engine core's client (`LLMEngine.engine_core`), shut down when a backend closes, so its worker exits now.
- The worker's model runner (`model_executor.driver_worker.model_runner`): vLLM's in-place weight reload.
- The CPU punica wrapper's LoRA ops (`vllm.lora.punica_wrapper.punica_cpu`): swapped for grouped ones.
- `sys.modules` while an in-process vLLM-CPU engine starts: modules its kernel scan cannot read are hidden.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# -- the engine of an `LLM` --------------------------------------------------------------------------------------


def llm_engine(llm: Any) -> Any:
    """The `LLMEngine` a `vllm.LLM` steps (`has_unfinished_requests()`, `step()`)."""
    return llm.llm_engine


def output_request_id(enqueued_id: str) -> str:
    """The id an output carries for a request `LLM.enqueue` returned as `enqueued_id`: `enqueue` returns vLLM's
    internal ids ("<n>-<8 random characters>"); outputs carry the external one (`LLM`'s counter, digits only)."""
    return enqueued_id.rsplit("-", 1)[0]


def shutdown_engine(llm: Any) -> None:
    """Shut an `LLM`'s engine core down now (its worker process exits), best effort: it may already be gone."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)  # the client of the worker process
    shutdown = getattr(core, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # noqa: BLE001, S110 - best effort: the engine may already be gone
            pass


def model_runner(llm: Any) -> Any:
    """The model runner of an in-process `LLM`'s only worker (it has `reload_weights`)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner


# -- the CPU punica wrapper's LoRA ops ---------------------------------------------------------------------------


def cpu_punica() -> Any | None:
    """vLLM's `punica_cpu` module, or None in a vLLM without the CPU LoRA path."""
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return None
    return punica_cpu


def patch_cpu_punica(ops: dict[str, Callable], add_lora_linear: Callable | None) -> Callable:
    """Swap `ops` (name -> function) into `punica_cpu`, and `add_lora_linear` (unless None) in for the
    `PunicaWrapperCPU` method; returns the wrapper's method as it was before."""
    punica_cpu = cpu_punica()
    for name, op in ops.items():
        setattr(punica_cpu, name, op)
    wrapper = punica_cpu.PunicaWrapperCPU
    before = wrapper.add_lora_linear
    if add_lora_linear is not None:
        wrapper.add_lora_linear = add_lora_linear
    return before


# -- the kernel scan of an in-process vLLM-CPU engine ------------------------------------------------------------

# Modules whose attributes answer every name, `__dict__` included, with something that is not a dict.
SCAN_UNSAFE_MODULES = ("llvmlite.binding.ffi",)


@contextmanager
def vllm_kernel_scan_guard() -> Iterator[None]:
    """Start an in-process vLLM-CPU engine inside this: the modules of `SCAN_UNSAFE_MODULES` are out of
    `sys.modules` while it starts, and back afterwards.

    An engine whose core runs in this process (TRL's colocated engine: `distributed_executor_backend=
    "external_launcher"`, which also sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for every later engine) rebinds
    vLLM-CPU 0.32's Triton kernel overrides by scanning every attribute of every loaded module, calling
    `vars(value).get(...)` on each value with a `__dict__` (`vllm.triton_utils.dispatcher._rebind_kernels`).
    llvmlite's `ffi.lib` (loaded by numba, which bm25s imports: the BM25 retriever) answers `__dict__` with a
    function wrapper, and the engine dies with "'_lib_fn_wrapper' object has no attribute 'get'". Nothing of
    vLLM's is in that module, so leaving it out of the scan changes nothing else."""
    hidden = {name: sys.modules.pop(name) for name in SCAN_UNSAFE_MODULES if name in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)
