"""Run a planned vLLM server: start it, wait until healthy, hand back the routing, stop it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from threading import Thread
from typing import Self
from urllib.parse import urlsplit

import httpx

from maps_train.errors import MapsTrainError
from maps_train.serve.plan import ServerPlan


def ensure_port_free(host: str, port: int) -> None:
    """Raise if something already listens on `host:port`. A server started there would fail to bind, and until it
    exited, the health checks of whoever waits for it would be answered by the one already there. SO_REUSEADDR
    keeps a port in TIME_WAIT (a server just stopped) from counting as taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise MapsTrainError(f"serve.host {host!r} does not resolve ({err.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise MapsTrainError(
                f"serve.port {port} on {host} is taken ({err.strerror}): another server is listening there; stop it "
                f"or pick a free port (serve.port=...)") from None


def wait_until_healthy(
    process: subprocess.Popen, health_url: str, timeout_s: float, on_exit: Callable[[int], str]
) -> None:
    """Poll `health_url` until it answers 200. If the process exits first, raise `on_exit(returncode)`; if the
    time runs out, raise. Stopping a server that never came up is the caller's (each stops its own way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MapsTrainError(on_exit(process.returncode))
        try:
            if httpx.get(health_url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise MapsTrainError(f"server did not become healthy at {health_url} within {timeout_s:.0f}s")


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGTERM when the process that started it dies, however it dies
    (Linux's PR_SET_PDEATHSIG; None elsewhere). libc is loaded here, before the fork: the child only calls prctl."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def start_process_group(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start a long-lived server `command` in its own session, so a Ctrl-C meant for its starter does not reach it
    (the starter stops it with `stop_process_group`), and tied to the starter's life: should the starter be killed
    outright (SIGKILL, no chance to clean up), the server still gets a SIGTERM instead of running on orphaned."""
    return subprocess.Popen(command, start_new_session=True, preexec_fn=_die_with_parent(), **popen_kwargs)


def stop_process_group(process: subprocess.Popen, first: int = signal.SIGTERM, grace_s: float = 30.0) -> None:
    """`first` to the process group of a server started with start_new_session=True (API server, engine core,
    workers), SIGKILL after `grace_s`; then reap it."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, first)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    except ProcessLookupError:  # it exited between the poll and the signal
        process.wait()


class VLLMServer:
    """A `vllm serve` subprocess; a context manager that is healthy inside and stopped after."""

    def __init__(self, plan: ServerPlan, log_path: str | Path | None = None, timeout_s: float = 600.0):
        self.plan = plan
        self.timeout_s = timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None
        self._tail: deque[str] = deque(maxlen=40)

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        log = self.log_path.open("a") if self.log_path else None
        for line in self.process.stdout:
            self._tail.append(line.rstrip())
            if log:
                log.write(line)
                log.flush()
        if log:
            log.close()

    def start(self) -> VLLMServer:
        from maps_train.platform import apply_runtime_defaults

        address = urlsplit(self.plan.url)
        ensure_port_free(address.hostname or "127.0.0.1", address.port or 80)
        # vLLM-CPU reads its KV-cache size and core binding from the environment (ignored on GPU builds).
        env = apply_runtime_defaults(dict(os.environ), kv_cache_gib=self.plan.cpu_kv_cache_gib)
        env.update(self.plan.env)
        # Ctrl-C reaches us, not vLLM: stop() then ends its whole process group.
        self.process = start_process_group(self.plan.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, env=env)
        Thread(target=self._pump, daemon=True).start()
        try:
            self.wait_healthy()
        except BaseException:  # a failed start or Ctrl-C while loading: never leave the server behind
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        assert self.process is not None

        def exited(code: int) -> str:
            last = next((line for line in reversed(self._tail) if line.strip()), "no output")
            return f"vllm serve exited with code {code}: {last}"

        wait_until_healthy(self.process, self.plan.url.removesuffix("/v1") + "/health", self.timeout_s, exited)

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
