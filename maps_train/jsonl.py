"""Reading JSON-lines files whose errors name the file and line (`path:line: ...`).

Lines are read as bytes and decoded one by one through `maps_train.safejson`, so invalid UTF-8, JSON nested
thousands deep or a 5,000-digit number is a one-line error naming the line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError

UTF8_BOM = b"\xef\xbb\xbf"


def iter_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line without its newline, whether a newline ended it) for every line of `path`."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            ended = line.endswith(b"\n")
            yield number, line[:-1] if ended else line, ended


def decode_object(line: bytes, where: str) -> dict[str, Any]:
    """One JSONL line as an object, or a `MapsTrainError` that starts with `where` (`file:line`)."""
    try:
        row = safejson.loads(line)
    except safejson.JSONLimitError as err:
        raise MapsTrainError(f"{where}: invalid JSON ({err})") from None
    if not isinstance(row, dict):
        raise MapsTrainError(f"{where}: expected a JSON object per line")
    return row


def iter_jsonl(path: str | Path, what: str = "file") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-empty line; a missing file, bad JSON or a non-object is one error line."""
    path = Path(path)
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such {what}")
    for number, line, _ in iter_lines(path):
        if number == 1 and line.startswith(UTF8_BOM):  # written by some editors and spreadsheet exports
            line = line[len(UTF8_BOM) :]
        if line.strip():
            yield number, decode_object(line, f"{path}:{number}")
