"""Passage corpora read by row number, without holding the corpus in memory.

Two formats:
- FlashRAG JSONL: `{"id", "contents"}` with `contents` = title, newline, text (a `title` field, when present, is
  used as the title), or `{"id", "title", "text"}`.
- DPR TSV (`psgs_w100.tsv`): columns `id`, `text`, `title`, with an optional header row.

Row i is the i-th non-blank record line. Its byte offset comes from a numpy int64 array built once by scanning the
file in blocks and cached under `$MAPS_TRAIN_HOME/corpus-offsets/`, keyed by the corpus fingerprint; the file itself
is memory-mapped, so 21M passages cost 8 bytes each of (memory-mapped) index and no Python objects. The offsets
cache is also keyed by mtime, so an edited file is always rescanned.

The fingerprint is `size + sha256 of 16 evenly spaced 64 KiB blocks` (head and tail included), not a sha256 of the
whole file: a 13 GB corpus fingerprints in milliseconds, and a copy on another machine (new mtime) still matches.
"""

from __future__ import annotations

import csv
import hashlib
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from maps_train.errors import MapsTrainError

FINGERPRINT_METHOD = "size+sha256(16 evenly spaced 64KiB blocks)"
_BLOCK = 64 * 1024
_SCAN_BLOCK = 64 * 1024 * 1024


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """What encoders and BM25 see: FlashRAG's `contents` (title, newline, text)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def corpus_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in (".tsv", ".tab"):
        return "dpr_tsv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "flashrag_jsonl"
    raise MapsTrainError(f"{path}: unknown corpus format '{suffix}' (expected .jsonl (FlashRAG) or .tsv (DPR))")


def fingerprint(path: str | Path) -> str:
    """Fast content fingerprint; see the module docstring for what it covers."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        if size <= 16 * _BLOCK:
            digest.update(handle.read())
        else:
            for start in np.linspace(0, size - _BLOCK, 16).astype(np.int64):
                handle.seek(int(start))
                digest.update(handle.read(_BLOCK))
    return f"{size}-{digest.hexdigest()[:32]}"


def _scan_line_starts(path: Path) -> np.ndarray:
    """Byte offsets of every non-blank line, by numpy over 64 MiB blocks (no per-line Python work)."""
    ends: list[np.ndarray] = []
    position = 0
    with path.open("rb") as handle:
        while True:
            block = handle.read(_SCAN_BLOCK)
            if not block:
                break
            newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + position
            ends.append(newlines)
            position += len(block)
    line_ends = np.concatenate(ends) if ends else np.empty(0, dtype=np.int64)
    size = position
    if size and (line_ends.size == 0 or line_ends[-1] != size - 1):
        line_ends = np.append(line_ends, size)  # last line without a trailing newline
    line_starts = np.concatenate([[0], line_ends[:-1] + 1]).astype(np.int64) if line_ends.size else line_ends
    lengths = line_ends - line_starts
    # blank lines ("" or "\r") are not records
    keep = lengths > 1
    if np.any(lengths == 1):
        with path.open("rb") as handle:
            mm = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                for i in np.flatnonzero(lengths == 1):
                    keep[i] = mm[line_starts[i] : line_starts[i] + 1] not in (b"\r", b" ", b"\t")
            finally:
                mm.close()
    return line_starts[keep]


def _offsets_cache(path: Path, print_: str) -> Path:
    """Keyed by fingerprint AND mtime: any edit (even one the sampled fingerprint misses) rescans the file."""
    from maps_train.paths import home

    return home() / "corpus-offsets" / f"{path.stem}-{print_}-{path.stat().st_mtime_ns}.npy"


class Corpus:
    """Random access to passages by row; `len(corpus)` rows."""

    def __init__(self, path: str | Path, offsets_path: str | Path | None = None):
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_file():
            raise MapsTrainError(f"{path}: no such corpus file")
        self.format = corpus_format(self.path)
        self.fingerprint = fingerprint(self.path)
        cache = Path(offsets_path) if offsets_path else _offsets_cache(self.path, self.fingerprint)
        if cache.exists():
            self.offsets = np.load(cache, mmap_mode="r")
        else:
            offsets = _scan_line_starts(self.path)
            offsets = self._drop_header(offsets)
            cache.parent.mkdir(parents=True, exist_ok=True)
            partial = cache.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(partial, offsets)
            os.replace(partial, cache)  # atomic: concurrent readers never see half a file
            self.offsets = np.load(cache, mmap_mode="r")
        self._handle = self.path.open("rb")
        self._mm = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ) if self.path.stat().st_size else b""

    def _drop_header(self, offsets: np.ndarray) -> np.ndarray:
        if self.format != "dpr_tsv" or offsets.size == 0:
            return offsets
        with self.path.open("rb") as handle:
            handle.seek(int(offsets[0]))
            first = handle.readline()
        return offsets[1:] if first.split(b"\t", 1)[0].strip().lower() == b"id" else offsets

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"{self.path}: row {row} out of range (0..{len(self) - 1})")
        start = int(self.offsets[row])
        end = self._mm.find(b"\n", start)
        raw = self._mm[start : end if end != -1 else len(self._mm)]
        return self._parse(raw, start)

    def get_many(self, rows: Sequence[int]) -> list[Passage]:
        return [self[int(row)] for row in rows]

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[Passage]:
        stop = len(self) if stop is None else min(stop, len(self))
        for row in range(start, stop):
            yield self[row]

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._handle.close()

    def line_number(self, byte_offset: int) -> int:
        """1-based line number of a byte offset (counts newlines; used only on the error path)."""
        newlines = 0
        for start in range(0, byte_offset, _SCAN_BLOCK):
            newlines += self._mm[start : min(start + _SCAN_BLOCK, byte_offset)].count(b"\n")
        return newlines + 1

    def _error(self, byte_offset: int, what: str) -> MapsTrainError:
        return MapsTrainError(f"{self.path}:{self.line_number(byte_offset)}: {what}")

    def _parse(self, raw: bytes, byte_offset: int) -> Passage:
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise self._error(byte_offset, "not valid UTF-8") from None
        if self.format == "dpr_tsv":
            return self._parse_tsv(line, byte_offset)
        return self._parse_jsonl(line, byte_offset)

    def _parse_jsonl(self, line: str, byte_offset: int) -> Passage:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise self._error(byte_offset, f"invalid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise self._error(byte_offset, "expected a JSON object")
        if "id" not in row:
            raise self._error(byte_offset, "missing field 'id'")
        if "contents" in row:
            contents = str(row["contents"])
            first, _, rest = contents.partition("\n")
            title = row.get("title")
            if title is None:
                return Passage(str(row["id"]), first.strip('"'), rest)
            # FlashRAG writes the title (sometimes quoted) as the first line of contents; don't repeat it
            return Passage(str(row["id"]), str(title), rest if first.strip('"') == str(title) else contents)
        if "text" in row:
            return Passage(str(row["id"]), str(row.get("title") or ""), str(row["text"]))
        raise self._error(byte_offset, "missing field 'contents' (or 'text')")

    def _parse_tsv(self, line: str, byte_offset: int) -> Passage:
        fields = next(csv.reader([line], delimiter="\t"))
        if len(fields) != 3:
            raise self._error(byte_offset, f"expected 3 tab-separated fields (id, text, title), found {len(fields)}")
        passage_id, text, title = fields
        if not passage_id:
            raise self._error(byte_offset, "empty field 'id'")
        return Passage(passage_id, title, text)
