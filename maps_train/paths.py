"""Where maps-train keeps what it materialises (builtin models): $MAPS_TRAIN_HOME, else the user cache dir; and the
one atomic write of a small file that every stage uses."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def home() -> Path:
    root = os.environ.get("MAPS_TRAIN_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "maps-train"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file of this process and thread, then one rename: concurrent readers
    and writers (two students building one SFT set, two loads of one recipe) see a whole file or the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as err:  # a full disk, or a folder where the file goes: no half file left, the error names `path`
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err


LOCK_FILE = ".lock"


@contextlib.contextmanager
def sole_writer(folder: Path, what: str):
    """Hold `<folder>/.lock` (an exclusive `flock`, released by the kernel when the process ends, killed or not)
    while a long run writes into `folder`; a second run into the same folder is a one-line error naming the holder
    instead of two runs interleaving their checkpoints."""
    import fcntl

    from maps_train.errors import MapsTrainError

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
