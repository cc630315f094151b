"""One writer per run folder: the lock a long run holds while it writes (`sole_writer`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from maps_train.errors import MapsTrainError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def sole_writer(folder: Path, what: str):
    """Hold `<folder>/.lock` (an exclusive `flock`, released by the kernel when the process ends, killed or not)
    while a long run writes into `folder`; a second run into the same folder is a one-line error naming the holder
    instead of two runs interleaving their checkpoints."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held for the whole run)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise MapsTrainError(f"{folder}: {what} is already writing here ({holder}); wait for it or set another "
                                 "output folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()
