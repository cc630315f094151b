"""The one exception type the CLI turns into a single readable line (no traceback), and the one wording of an
operating-system error (a full disk, a read error, a path that is a folder or a symlink loop) as such a line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class MapsTrainError(Exception):
    """A user-facing error: bad input, bad recipe, missing file, unreachable service.

    The message must fit on one line and name the file, line or field at fault.
    """


class ConfigError(MapsTrainError):
    """A recipe that does not match its dataclass: unknown key, wrong type, missing file."""


def os_error_line(err: OSError, path: str | os.PathLike | None = None, action: str | None = None) -> str:
    """`path: cannot <action>: <reason>` for an OSError; `path` defaults to the one the error names.

    An error raised by a write on an open file (ENOSPC, EIO) names no file, so the caller that knows the path
    passes it; `os.strerror` covers errors built from an errno alone.
    """
    reason = err.strerror or (os.strerror(err.errno) if err.errno else str(err) or type(err).__name__)
    named = path if path is not None else err.filename
    if named is None:
        return reason
    target = f" -> {err.filename2}" if path is None and err.filename2 is not None else ""
    return f"{os.fsdecode(named)}{target}: " + (f"cannot {action}: " if action else "") + reason


@contextmanager
def io_errors(path: str | os.PathLike, action: str) -> Iterator[None]:
    """Any OSError inside becomes a `MapsTrainError` naming `path` (`runs/x/answers.jsonl: cannot append: No space
    left on device`), so the stores' own reads and writes fail as one line, whatever the library call was."""
    try:
        yield
    except OSError as err:
        raise MapsTrainError(os_error_line(err, path, action)) from err
