"""Reading JSON-lines files whose errors name the file and line (`path:line: ...`).

Lines are read as bytes and decoded one by one through `maps_train.safejson`, so invalid UTF-8, JSON nested
thousands deep or a 5,000-digit number is a one-line error naming the line, never a traceback. A reader may cap
a line's bytes (`max_line_bytes`): the line is read only up to the cap, so a 200 MB line is refused without
being held. An OS error while reading (EIO, a folder or a symlink loop where the file should be) is one line
naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError, io_errors

UTF8_BOM = b"\xef\xbb\xbf"


def iter_lines(path: Path, max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line without its newline, whether a newline ended it) for every line of `path`.

    With `max_line_bytes`, a line longer than that (its newline not counted) is a `MapsTrainError` naming the
    line, raised after reading at most that many bytes of it.
    """
    # readline(-1) reads a whole line; a cap reads one byte past it, enough to tell "too long" from "just fits"
    cap = -1 if max_line_bytes is None else max_line_bytes + 1
    with io_errors(path, "read"), path.open("rb") as handle:
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
