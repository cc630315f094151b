"""One stage of a study: a maps-train command a user could run, printed, its output teed to <out>/logs/<stage>.log,
a failure naming that log (the study's own words: "study stage", not the demo's).

Stages that start a model (traces, train, rl, eval) take turns on the machine (`cores_turn`): every vLLM-CPU engine
binds its threads to all cores (`VLLM_CPU_OMP_THREADS_BIND`), so two studies' engines at once slow each other
many-fold (issue 65: traces from about 5.5 to about 1 question a minute, and the other engine's shared-memory
broadcast timed out). A study's stages run one after another anyway; the turn makes a second study on the same
machine ($MAPS_TRAIN_HOME) wait for the first one's stage to end, saying whose, instead of both crawling.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import typer

from maps_train.demo import _run_step
from maps_train.errors import MapsTrainError, os_error_line
from maps_train.paths import home

CORES_LOCK = "study-cores.lock"
MODEL_STAGES = ("traces", "train", "rl", "eval")


@contextlib.contextmanager
def cores_turn(stage: str, lock_dir: Path | None = None,
               on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold <lock_dir>/study-cores.lock (default $MAPS_TRAIN_HOME) while `stage` runs, waiting for another study's
    stage that holds it (one printed line naming it; `on_wait` gets that line too). The kernel releases the lock
    when the holder ends, killed or not."""
    folder = Path(lock_dir) if lock_dir is not None else home()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / CORES_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise MapsTrainError(os_error_line(err, folder / CORES_LOCK, "open the study's cores lock")) from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another study"
            line = f"{stage}: waiting for the cores ({holder}); one study's model stage runs at a time"
            typer.echo(line)
            if on_wait is not None:
                on_wait(line)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"study stage {stage}, pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)


def run_stage(name: str, args: list[str], log_dir: Path, env: dict[str, str]) -> float:
    """Run `maps-train ARGS`; returns its seconds. A failure is one line naming the stage and its log."""
    return _run_step(name, args, log_dir, env, kind="study stage")


__all__ = ["run_stage"]
