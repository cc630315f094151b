"""The one append-only JSONL file of keyed records (answers, traces, eval results): resume, never duplicate,
never lose a complete record.

One torn-line rule for every such file: a kill can leave only the LAST line cut short, and a cut line has no final
newline. So a last line without a newline that does not decode is torn and is cut off before anything is appended
(a reader that must not modify the file skips it). Every other bad line, a complete last line included, is
somebody's edit or a bug, never a kill: it is a one-line error naming the file and line, and nothing is deleted.
Everything written is valid UTF-8 (`safejson.dumps_line`), one flushed write per record.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError
from maps_train.jsonl import decode_object, iter_lines

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
                    with path.open("r+b") as handle:
                        handle.truncate(start)
                return
            if repair:  # complete, only its newline was lost: finish the line so the next record starts fresh
                with path.open("ab") as handle:
                    handle.write(b"\n")
            yield number, record
            return
        yield number, decode_object(line, f"{path}:{number}")


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
        if not self.path.exists():
            return records
        for number, record in read_records(self.path, repair=repair):
            records.setdefault(self.key_of(record, f"{self.path}:{number}"), record)
        return records

    def keep_only(self, keys: set) -> int:
        """Rewrite the file without records outside `keys` and without repeats; returns how many were dropped.

        Used to drop traces whose answer line never got written (a kill between the two appends).
        """
        if not self.path.exists():
            return 0
        kept, seen, dropped = [], set(), 0
        for number, record in read_records(self.path, repair=True):
            key = self.key_of(record, f"{self.path}:{number}")
            if key in keys and key not in seen:
                seen.add(key)
                kept.append(record)
            else:
                dropped += 1
        if dropped:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            with tmp.open("w", encoding="utf-8") as handle:
                handle.writelines(safejson.dumps_line(record) for record in kept)
            os.replace(tmp, self.path)
        return dropped

    def append(self, record: dict[str, Any]) -> None:
        self.key_of(record, str(self.path))
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        # One write per record, flushed: a kill loses at most the record being written.
        self._handle.write(safejson.dumps_line(record))
        self._handle.flush()

    def extend(self, records: Iterable[dict[str, Any]]) -> int:
        count = 0
        for record in records:
            self.append(record)
            count += 1
        return count

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> KeyedJsonl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
