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

Bad input is one error line naming the file and line: invalid UTF-8, invalid JSON (including nesting past Python's
recursion limit or integers past its digit limit), an id that is not a string or an integer, a TSV cell over
`csv.field_size_limit()` characters. A UTF-8 BOM at the start of the file (Excel, some Windows tools) is dropped, so
a DPR header behind one is still recognised as the header rather than indexed as a passage.

Passage ids must be unique: the retriever answers with ids, so a repeated id would be indexed and served twice.
Reading a row does not look for repeats (that needs the whole file); `require_unique_ids` does, and the index
builders call it before embedding anything: the first repeated id is an error naming both lines. We refuse rather
than dedupe because two passages under one id are usually two different texts (a merge gone wrong), and keeping
either one would silently change what the index returns.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import mmap
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from maps_train.errors import MapsTrainError

FINGERPRINT_METHOD = "size+sha256(16 evenly spaced 64KiB blocks)"
_BLOCK = 64 * 1024
_SCAN_BLOCK = 64 * 1024 * 1024
# Bumped when the rows found in a file change: version 2 drops a DPR header that sits behind a BOM.
_OFFSETS_VERSION = 2


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

    return home() / "corpus-offsets" / f"{path.stem}-{print_}-{path.stat().st_mtime_ns}-v{_OFFSETS_VERSION}.npy"


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
            first = handle.readline().removeprefix(codecs.BOM_UTF8)
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

    def row_error(self, row: int, what: str) -> MapsTrainError:
        """`MapsTrainError` naming the file line of `row`."""
        return self._error(int(self.offsets[row]), what)

    def _error(self, byte_offset: int, what: str) -> MapsTrainError:
        return MapsTrainError(f"{self.path}:{self.line_number(byte_offset)}: {what}")

    def _parse(self, raw: bytes, byte_offset: int) -> Passage:
        if byte_offset == 0:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise self._error(byte_offset, "not valid UTF-8") from None
        if self.format == "dpr_tsv":
            return self._parse_tsv(line, byte_offset)
        return self._parse_jsonl(line, byte_offset)

    def _parse_jsonl(self, line: str, byte_offset: int) -> Passage:
        # json, not maps_train.safejson: this runs for every passage of a 21M-row corpus, and safejson's depth scan
        # in Python would cost minutes per build. The bad cases still end here as one line: too deep is a
        # RecursionError, a 5,000-digit integer a ValueError, and only string fields are used (NaN cannot land).
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise self._error(byte_offset, f"invalid JSON ({err.msg} at column {err.colno})") from None
        except RecursionError:
            raise self._error(byte_offset, "invalid JSON (nested too deeply)") from None
        except ValueError as err:
            raise self._error(byte_offset, f"invalid JSON ({str(err).split(';')[0]})") from None
        if not isinstance(row, dict):
            raise self._error(byte_offset, "expected a JSON object")
        if "id" not in row:
            raise self._error(byte_offset, "missing field 'id'")
        passage_id = self._check_id(row["id"], byte_offset)
        title = self._text_field(row, "title", byte_offset, optional=True)
        if "contents" in row:
            contents = self._text_field(row, "contents", byte_offset)
            first, _, rest = contents.partition("\n")
            if title is None:
                return Passage(passage_id, first.strip('"'), rest)
            # FlashRAG writes the title (sometimes quoted) as the first line of contents; don't repeat it
            return Passage(passage_id, title, rest if first.strip('"') == title else contents)
        if "text" in row:
            return Passage(passage_id, title or "", self._text_field(row, "text", byte_offset))
        raise self._error(byte_offset, "missing field 'contents' (or 'text')")

    def _check_id(self, value: object, byte_offset: int) -> str:
        # str(None) would index a passage under the id "None"; a bool or float id would not round-trip
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self._error(byte_offset, f"id: expected a string or an integer, got {_json_kind(value)}")
        if not str(value).strip():
            raise self._error(byte_offset, "id: empty")
        return str(value)

    def _text_field(self, row: dict, name: str, byte_offset: int, optional: bool = False) -> str | None:
        value = row.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self._error(byte_offset, f"{name}: expected a string, got {_json_kind(value)}")
        return value

    def _parse_tsv(self, line: str, byte_offset: int) -> Passage:
        try:
            fields = next(csv.reader([line], delimiter="\t"))
        except csv.Error as err:
            if "field larger than field limit" in str(err):
                what = f"a field is longer than {csv.field_size_limit()} characters (csv.field_size_limit)"
            else:
                what = f"invalid TSV ({err})"
            raise self._error(byte_offset, what) from None
        if len(fields) != 3:
            raise self._error(byte_offset, f"expected 3 tab-separated fields (id, text, title), found {len(fields)}")
        passage_id, text, title = fields
        if not passage_id:
            raise self._error(byte_offset, "empty field 'id'")
        return Passage(passage_id, title, text)


def _json_kind(value: object) -> str:
    """A value's JSON type name for error messages (null, not NoneType)."""
    names = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "list"}
    return names.get(type(value), "object")


# --- unique ids -----------------------------------------------------------------------------------------------------


def _id_hashes(corpus: Corpus) -> np.ndarray:
    """A 64-bit hash of every row's id, in row order: one pass over the corpus, 8 bytes a row and no Python strings
    kept. Python's own str hash: salted per process, so these never leave the process."""
    return np.fromiter((hash(passage.id) for passage in corpus.iter_rows()), dtype=np.int64, count=len(corpus))


def find_duplicate_id(corpus: Corpus) -> tuple[str, int, int] | None:
    """The first id that appears twice (by its second occurrence) and the rows of both occurrences, or None.

    One pass that keeps a 64-bit hash per row (8 bytes each, not a Python set of 21M strings); only rows whose
    hash repeats are read again to compare the ids themselves.
    """
    if len(corpus) < 2:
        return None
    hashes = _id_hashes(corpus)
    order = np.argsort(hashes, kind="stable")
    repeats = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if repeats.size == 0:
        return None
    candidates = np.union1d(order[repeats], order[repeats + 1])  # sorted: file order
    first_row: dict[str, int] = {}
    for row in candidates.tolist():
        passage_id = corpus[row].id
        if passage_id in first_row:
            return passage_id, first_row[passage_id], row
        first_row[passage_id] = row
    return None  # only hash collisions


def require_unique_ids(corpus: Corpus) -> None:
    """Raise `MapsTrainError` (`file:line: passage id 'x' appears twice (first at line n)`) on a repeated id."""
    duplicate = find_duplicate_id(corpus)
    if duplicate is None:
        return
    passage_id, first, second = duplicate
    first_line = corpus.line_number(int(corpus.offsets[first]))
    raise corpus.row_error(
        second,
        f"passage id {passage_id!r} appears twice (first at line {first_line}); ids must be unique",
    )


def passages_by_id(path: str | Path, wanted: Iterable[str]) -> dict[str, Passage]:
    """The passages of the `wanted` ids, in one pass over the corpus that stops once all are found (traces keep
    only ids; evidence recall and the analyses look the few they need up). For many lookups in one process, one
    `PassageLookup` reads the corpus once for all of them."""
    wanted = set(wanted)
    found: dict[str, Passage] = {}
    if not wanted:
        return found
    corpus = Corpus(path)
    try:
        for passage in corpus.iter_rows():
            if passage.id in wanted:
                found[passage.id] = passage
                if len(found) == len(wanted):
                    break
    finally:
        corpus.close()
    return found


class PassageLookup:
    """Passages by id for a caller that looks ids up again and again: a suite scores evidence recall once per
    (system, data set) run, and `passages_by_id` would read the whole corpus for each (96 times for 16 systems x
    6 data sets over a 21M-passage corpus).

    The first lookup reads the corpus once, keeping each row's id hash beside its row, sorted (16 bytes a row: about
    340 MB for 21M passages, against gigabytes for a dict of ids). Every lookup then reads only the rows whose hash
    matches a wanted id, through the corpus's on-disk offsets, and compares the ids themselves: a hash collision
    costs one more row read, never a wrong passage. Thread-safe; `close()` releases the memory map.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._corpus: Corpus | None = None
        self._sorted_hashes = np.empty(0, dtype=np.int64)
        self._rows_by_hash = np.empty(0, dtype=np.int64)

    def __call__(self, wanted: Iterable[str]) -> dict[str, Passage]:
        wanted_ids = sorted(set(wanted))
        if not wanted_ids:
            return {}
        with self._lock:
            corpus = self._indexed_corpus()
            keys = np.fromiter((hash(passage_id) for passage_id in wanted_ids), dtype=np.int64, count=len(wanted_ids))
            starts = np.searchsorted(self._sorted_hashes, keys, side="left")
            ends = np.searchsorted(self._sorted_hashes, keys, side="right")
            found: dict[str, Passage] = {}
            for passage_id, start, end in zip(wanted_ids, starts.tolist(), ends.tolist()):
                for row in self._rows_by_hash[start:end].tolist():
                    passage = corpus[row]
                    if passage.id == passage_id:
                        found[passage_id] = passage
                        break
            return found

    def _indexed_corpus(self) -> Corpus:
        """The open corpus, its id hashes read on first use (callers hold the lock)."""
        if self._corpus is None:
            corpus = Corpus(self.path)
            try:
                hashes = _id_hashes(corpus)
            except BaseException:
                corpus.close()
                raise
            self._rows_by_hash = np.argsort(hashes, kind="stable")
            self._sorted_hashes = hashes[self._rows_by_hash]
            self._corpus = corpus
        return self._corpus

    def close(self) -> None:
        with self._lock:
            if self._corpus is not None:
                self._corpus.close()
                self._corpus = None
                self._sorted_hashes = self._rows_by_hash = np.empty(0, dtype=np.int64)
