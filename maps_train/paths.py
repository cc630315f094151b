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

