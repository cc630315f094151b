"""One retrieval service for the GRPO ranks of a machine, instead of one in-process index per rank.

With several ranks on a machine (LOCAL_WORLD_SIZE > 1) and no `retrieval.service_url`, each rank would load its own
copy of a dense index (wiki-18: 7 ranks x 32-65 GB of host memory) and search it on the one OpenMP thread accelerate
leaves it. Instead the machine's first rank (LOCAL_RANK 0) starts `maps-train retrieve serve` on a free local port,
on every CPU of the machine, and writes its URL to a file; every rank, the first included, searches through a
`RetrievalClient`. The service stops with the rank that started it (SIGTERM when that process ends, however it
ends). One rank, a BM25 index or a named service: the recipe's retriever as before (`build_retriever`).

The URL file is one per launch (named by the host, the launcher process that all of a machine's ranks share, and
the rendezvous address), written whole through a rename, names the rank that owns the service (its pid and that
process's start time) and is removed when that rank exits. A reader takes a URL only from a file whose owner is
alive: a file left by a killed launch (or an old plain-text one) is never read, however its name came about.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.paths import write_text_atomic
from maps_train.platform import free_port

START_TIMEOUT_S = 900.0  # a 21M-passage index loads in minutes


def _launch_id() -> str:
    """What tells this launch's URL file from an earlier launch's: the launcher process every rank of the machine
    is a child of (accelerate's / torchrun's agent), and the rendezvous address every rank shares."""
    return (f"{socket.gethostname()}-{os.getppid()}-{os.environ.get('MASTER_ADDR', 'local')}-"
            f"{os.environ.get('MASTER_PORT', '0')}")


def url_file(recipe: Any) -> Path:
    return Path(recipe.rl.output_dir) / f".retrieval-{_launch_id()}.url"


def _started(pid: int) -> float | None:
    """When process `pid` started (psutil's create time), None when there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def write_url(path: Path, url: str) -> None:
    """The service's URL, owned by this process, written whole (a reader sees all of it or no file)."""
    write_text_atomic(path, json.dumps({"url": url, "pid": os.getpid(), "started": _started(os.getpid())}) + "\n")


def live_url(path: Path) -> str | None:
    """The URL in `path` when the process that wrote it is still the one running under its pid; None otherwise
    (no file, a file of another format, or a stale one: its owner exited and the service with it)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        url, pid, started = str(record["url"]), int(record["pid"]), float(record["started"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    now = _started(pid)
    return url if now is not None and abs(now - started) < 0.01 else None


def forget_url(path: Path) -> None:
    """Remove the URL file if this process owns it (at exit of the rank that started the service)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        if json.loads(path.read_text(encoding="utf-8"))["pid"] == os.getpid():
            path.unlink()


def _die_with_parent() -> None:
    """In the service's process: SIGTERM when the rank that started it ends (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def start_service(recipe: Any, timeout_s: float = START_TIMEOUT_S) -> tuple[str, subprocess.Popen]:
    """Build the index if missing, start `maps-train retrieve serve` over it, wait until healthy; (url, process)."""
    from maps_train.retrieval.client import RetrievalClient
    from maps_train.retrieval.factory import ensure_index

    cfg = recipe.retrieval
    index_dir, _ = ensure_index(cfg)
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("LOCAL_WORLD_SIZE", "OMP_NUM_THREADS")}  # the service searches on every CPU
    command = [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(index_dir),
               "--port", str(port), "--corpus", str(cfg.corpus)]
    process = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    client = RetrievalClient(url, timeout_s=5.0, retries=0)
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise MapsTrainError(f"rl: the ranks' retrieval service exited with {process.returncode} while starting "
                                 f"({' '.join(command)})")
        try:
            client.health()
            return url, process
        except Exception:  # not listening yet
            if time.monotonic() > deadline:
                process.terminate()
                raise MapsTrainError(f"rl: the ranks' retrieval service did not answer in {timeout_s:.0f} s") from None
            time.sleep(0.5)


def rank_retriever(recipe: Any, timeout_s: float = START_TIMEOUT_S) -> tuple[Any, subprocess.Popen | None]:
    """The retriever this rank searches through, and the service process it started (None when it started none)."""
    from maps_train.retrieval.client import RetrievalClient
    from maps_train.retrieval.factory import build_retriever

    cfg = recipe.retrieval
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    if cfg.service_url or cfg.kind != "dense" or local_ranks < 2:
        return build_retriever(cfg), None
    path = url_file(recipe)
    process = None
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:
        url, process = start_service(recipe, timeout_s)
        write_url(path, url)
        atexit.register(forget_url, path)
    else:
        deadline = time.monotonic() + timeout_s
        while (url := live_url(path)) is None:  # a stale file (its owner gone) is waited past, never read
            if time.monotonic() > deadline:
                raise MapsTrainError(f"rl: no live retrieval service URL in {path} after {timeout_s:.0f} s (the "
                                     f"machine's first rank writes it when its service answers)")
            time.sleep(0.5)
    return RetrievalClient(url, timeout_s=cfg.service_timeout_s), process
