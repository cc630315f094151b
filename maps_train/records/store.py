"""The one append-only JSONL file of keyed records (answers, traces, eval results): resume, never duplicate,
never lose a complete record.

One torn-line rule for every such file: a kill can leave only the LAST line cut short, and a cut line has no final
newline. So a last line without a newline that does not decode is torn and is cut off before anything is appended
(a reader that must not modify the file skips it). Every other bad line, a complete last line included, is
somebody's edit or a bug, never a kill: it is a one-line error naming the file and line, and nothing is deleted.
Everything written is valid UTF-8 (`safejson.dumps_line`), one flushed write per record. Nothing here ever
rewrites or shortens a complete record. An OS error (a full disk, EIO, a folder or a symlink loop where the file
should be) is a one-line `MapsTrainError` naming the file; a write cut short by a full disk leaves at most a torn
last line, which the next run cuts off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError, io_errors, os_error_line
from maps_train.jsonl import decode_object, iter_lines, open_regular

Key = str | tuple[str, ...]


def read_records(path: Path, repair: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each record of `path`; a torn last line is skipped, and cut off when `repair`."""
    offset = 0
    for number, line, ended in iter_lines(path):
        start, offset = offset, offset + len(line) + (1 if ended else 0)
        if not line.strip():
            continue
        if not ended:
            try:
                record = safejson.loads(line)
            except safejson.JSONLimitError:
                record = None
            if not isinstance(record, dict):  # torn by a kill mid-write
                if repair:
                    with io_errors(path, "cut its torn last line"), path.open("r+b") as handle:
                        handle.truncate(start)
                return
            if repair:  # complete, only its newline was lost: finish the line so the next record starts fresh
                with io_errors(path, "append"), path.open("ab") as handle:
                    handle.write(b"\n")
            yield number, record
            return
        yield number, decode_object(line, f"{path}:{number}")


def absent(path: Path) -> bool:
    """Whether nothing is at `path` yet (a link to a file not made yet counts as absent). Unlike `Path.exists`,
    which answers False, a symlink loop or a folder without permission is a one-line error naming the path."""
    try:
        path.stat()
    except FileNotFoundError:
        return True
    except OSError as err:
        raise MapsTrainError(os_error_line(err, path, "read")) from err
    return False


class KeyedJsonl:
    """Records with a unique key (a field, or a tuple of fields), appended and flushed one by one."""

    def __init__(self, path: str | Path, key: Key = "question_id"):
        self.path = Path(path)
        self.fields = (key,) if isinstance(key, str) else tuple(key)
        self._handle = None

    def key_of(self, record: dict[str, Any], where: str) -> str | tuple[str, ...]:
        values = []
        for name in self.fields:
            value = record.get(name)
            if value is None:
                raise MapsTrainError(f"{where}: missing field '{name}'")
            values.append(str(value))
        return values[0] if len(values) == 1 else tuple(values)

    def load(self, repair: bool = True) -> dict[Any, dict[str, Any]]:
        """Records by key in file order, first occurrence kept; an absent file holds nothing.

        `repair` cuts a torn last line off (before appending); readers that only look pass False.
        """
        records: dict[Any, dict[str, Any]] = {}
        if absent(self.path):
            return records
        for number, record in read_records(self.path, repair=repair):
            records.setdefault(self.key_of(record, f"{self.path}:{number}"), record)
        return records

    def append(self, record: dict[str, Any]) -> None:
        self.key_of(record, str(self.path))
        line = safejson.dumps_line(record)
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "append")
            # One write per record, flushed: a kill loses at most the record being written.
            self._handle.write(line.encode("utf-8"))
            self._handle.flush()
        except OSError as err:
            self._drop_handle()  # a later append reopens the file rather than reuse a failed handle
            raise MapsTrainError(os_error_line(err, self.path, "append")) from err

    def extend(self, records: Iterable[dict[str, Any]]) -> int:
        count = 0
        for record in records:
            self.append(record)
            count += 1
        return count

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            with io_errors(self.path, "close"):
                handle.close()

    def _drop_handle(self) -> None:
        """Close the handle after a failed write; its flush fails again and is ignored (the file is closed anyway,
        and what reached the disk is at most a torn last line)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def __enter__(self) -> KeyedJsonl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
