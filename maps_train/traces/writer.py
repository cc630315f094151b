"""Append-only JSONL keyed by question id: resume after a kill, never duplicate, never lose a complete record.

A killed run can leave a last line cut in the middle; `KeyedJsonl.load()` cuts the file back to its last complete
record before anything is appended, so the next record starts on a fresh line. A bad line anywhere else is
somebody's edit, not a kill, and is reported as `file:line: ...` rather than silently skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.traces.schema import TraceFormatError, TraceRecord


def _complete_lines(path: Path, repair: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each complete JSON object line; a torn last line is cut off (when `repair`)."""
    data = path.read_bytes()
    offset = 0
    number = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        last = end == -1 or data[end + 1 :].strip() == b""
        line = data[offset:] if end == -1 else data[offset:end]
        number += 1
        next_offset = len(data) if end == -1 else end + 1
        if not line.strip():
            offset = next_offset
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            torn = end == -1  # parsed, but the newline never made it: still complete as a record
        except ValueError as err:
            if last:
                # A kill mid-write: drop the partial record, so the file again ends on a record boundary.
                if repair:
                    with path.open("r+b") as handle:
                        handle.truncate(offset)
                return
            raise MapsTrainError(f"{path}:{number}: invalid JSON line ({err})") from None
        if torn and repair:
            with path.open("ab") as handle:
                handle.write(b"\n")
        yield number, record
        offset = next_offset


class KeyedJsonl:
    """One JSONL file of records with a unique key (default `question_id`), appended and flushed one by one."""

    def __init__(self, path: str | Path, key: str = "question_id"):
        self.path = Path(path)
        self.key = key
        self._handle = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Records by key, first occurrence kept; repairs a torn last line. An absent file holds nothing."""
        records: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return records
        for number, record in _complete_lines(self.path, repair=True):
            if self.key not in record:
                raise MapsTrainError(f"{self.path}:{number}: missing field '{self.key}'")
            records.setdefault(str(record[self.key]), record)
        return records

    def keep_only(self, keys: set[str]) -> int:
        """Rewrite the file without records outside `keys` and without repeats; returns how many were dropped.

        Used to drop traces whose answer line never got written (a kill between the two appends).
        """
        if not self.path.exists():
            return 0
        kept, seen, dropped = [], set(), 0
        for _, record in _complete_lines(self.path, repair=True):
            value = str(record.get(self.key))
            if value in keys and value not in seen:
                seen.add(value)
                kept.append(record)
            else:
                dropped += 1
        if dropped:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            with tmp.open("w", encoding="utf-8") as handle:
                for record in kept:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            os.replace(tmp, self.path)
        return dropped

    def append(self, record: dict[str, Any]) -> None:
        if self.key not in record:
            raise ValueError(f"record has no '{self.key}'")
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        # One write per record, flushed: a kill loses at most the record being written.
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> KeyedJsonl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_traces(path: str | Path) -> Iterator[tuple[int, TraceRecord | TraceFormatError]]:
    """(line number, record or error) for every non-empty line of a traces file; never raises on content.

    The error's message is already prefixed with `file:line:`, ready to report or to skip. A torn last line
    (from a killed writer) is reported as an error too; the file is not modified.
    """
    path = Path(path)
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such traces file")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                yield number, TraceFormatError(f"{path}:{number}: invalid JSON ({err.msg})")
                continue
            try:
                yield number, TraceRecord.from_dict(data)
            except TraceFormatError as err:
                yield number, TraceFormatError(f"{path}:{number}: {err}")
