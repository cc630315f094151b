"""Reading JSON-lines files whose errors name the file and line (`path:line: ...`).

Lines are read as bytes and decoded one by one through `maps_train.safejson`, so invalid UTF-8, JSON nested
thousands deep or a 5,000-digit number is a one-line error naming the line, never a traceback. A reader may cap
a line's bytes (`max_line_bytes`, by default `MAX_RECORD_LINE_BYTES`): the line is read only up to the cap, so a
200 MB line, or a link to an endless device, is refused without being held. Only regular files are read (a FIFO,
a device or a socket at the path, or a link to one, is one line naming the path, without opening it in a way that
could block). An OS error while reading (EIO, a folder or a symlink loop where the file should be) is one line
naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from maps_train import safejson
from maps_train.errors import MapsTrainError, io_errors

UTF8_BOM = b"\xef\xbb\xbf"
# A record line's cap when a reader names none (answers, traces, results read back on resume): a trace holds every
# role call verbatim, far below this, and a line is never held past it.
MAX_RECORD_LINE_BYTES = 64 * 1024 * 1024


def open_regular(path: Path, flags: int, action: str) -> BinaryIO:
    """`path` opened with `os.open` flags as a binary file, never blocking on the open: for reading, only a regular
    file (a link to one counts; a FIFO, device or socket is a `MapsTrainError` naming the path, so a link to an
    endless device is never read); for appending, a FIFO without a reader is refused (ENXIO) instead of blocking
    the run forever. The non-blocking flag is cleared once the file is checked."""
    with io_errors(path, action):
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if not flags & (os.O_WRONLY | os.O_RDWR) and not stat.S_ISREG(mode):
                raise MapsTrainError(f"{path}: not a regular file (a FIFO, device or socket, or a link to one); "
                                     "only regular files are read here")
            os.set_blocking(fd, True)
            return os.fdopen(fd, "ab" if flags & os.O_APPEND else "rb")
        except BaseException:
            os.close(fd)
            raise


def iter_lines(path: Path, max_line_bytes: int | None = MAX_RECORD_LINE_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line without its newline, whether a newline ended it) for every line of `path`, a regular
    file (anything else is one error line).

    With `max_line_bytes` (by default `MAX_RECORD_LINE_BYTES`), a line longer than that (its newline not counted)
    is a `MapsTrainError` naming the line, raised after reading at most that many bytes of it.
    """
    # readline(-1) reads a whole line; a cap reads one byte past it, enough to tell "too long" from "just fits"
    cap = -1 if max_line_bytes is None else max_line_bytes + 1
    with open_regular(path, os.O_RDONLY, "read") as handle, io_errors(path, "read"):
        number = 0
        while line := handle.readline(cap):
            number += 1
            ended = line.endswith(b"\n")
            body = line[:-1] if ended else line
            if max_line_bytes is not None and len(body) > max_line_bytes:
                raise MapsTrainError(f"{path}:{number}: line longer than {max_line_bytes:,} bytes")
            yield number, body, ended


def decode_object(line: bytes, where: str) -> dict[str, Any]:
    """One JSONL line as an object, or a `MapsTrainError` that starts with `where` (`file:line`)."""
    try:
        row = safejson.loads(line)
    except safejson.JSONLimitError as err:
        raise MapsTrainError(f"{where}: invalid JSON ({err})") from None
    if not isinstance(row, dict):
        raise MapsTrainError(f"{where}: expected a JSON object per line")
    return row


def iter_jsonl(
    path: str | Path, what: str = "file", max_line_bytes: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-empty line; a missing file, bad JSON, a non-object or a line over
    `max_line_bytes` is one error line."""
    path = Path(path)
    if path.is_dir():
        raise MapsTrainError(f"{path}: is a folder, not a {what}")
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such {what}")
    for number, line, _ in iter_lines(path, max_line_bytes):
        if number == 1 and line.startswith(UTF8_BOM):  # written by some editors and spreadsheet exports
            line = line[len(UTF8_BOM) :]
        if line.strip():
            yield number, decode_object(line, f"{path}:{number}")
