"""JSON in and out with bounds: decoding that never recurses, never raises anything but `JSONLimitError`, and
encoding that always yields valid UTF-8.

Python's `json` recurses once per nesting level (a deep input raises RecursionError), refuses integers over 4,300
digits with a bare ValueError, accepts NaN/Infinity, and keeps lone UTF-16 surrogates (`"\\ud800"`) that later
crash a UTF-8 writer. Everything that reads model output or a user's file goes through `loads`; everything that
writes a record goes through `dumps_line`.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # records and role outputs nest a few levels; 64 is far above any legitimate file
MAX_INT_DIGITS = 100

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONLimitError(ValueError):
    """Not JSON, or JSON beyond a bound (depth, integer size, non-finite number, invalid UTF-8)."""


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONLimitError(f"integer with {len(literal)} digits (limit {MAX_INT_DIGITS})")
    return int(literal)


def _no_constant(name: str) -> Any:
    raise JSONLimitError(f"non-finite number {name} is not JSON")


def _bounded_float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise JSONLimitError(f"number {literal[:20]} overflows a float")
    return value


DECODER = json.JSONDecoder(parse_int=_bounded_int, parse_float=_bounded_float, parse_constant=_no_constant)


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    if exceeds_depth(text, 0, max_depth):
        raise JSONLimitError(f"JSON nested deeper than {max_depth} levels")


_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def exceeds_depth(text: str, start: int, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON value starting at `text[start]` nests deeper than `limit`, without decoding it.

    Checked before `raw_decode` at a start inside model text: the C decoder recurses once per level, guarded
    only by the interpreter's recursion limit. Too few brackets after `start` answers at once (a count at C
    speed); otherwise the scan jumps from bracket to quote to backslash (a regex skips the other characters)
    and stops where the value closes or the limit is passed."""
    if text.count("{", start) + text.count("[", start) <= limit:
        return False
    depth, in_string, escaped_at = 0, False, -1
    for match in _STRUCTURE.finditer(text, start):
        index = match.start()
        if index == escaped_at:  # the character after a backslash in a string
            continue
        char = text[index]
        if in_string:
            if char == "\\":
                escaped_at = index + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
            if depth <= 0:
                return False
    return False


def loads(data: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON value, or `JSONLimitError` with a short reason (never RecursionError, UnicodeDecodeError, ...)."""
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            raise JSONLimitError(f"not valid UTF-8 (byte {err.start})") from None
    check_depth(data, max_depth)
    try:
        return DECODER.decode(data)
    except JSONLimitError:
        raise
    except json.JSONDecodeError as err:
        raise JSONLimitError(err.msg + f" (char {err.pos})") from None
    except (ValueError, RecursionError, OverflowError) as err:  # defensive: the bounds above should stop these
        raise JSONLimitError(str(err)[:200]) from None


def raw_decode(text: str, start: int, max_depth: int = MAX_DEPTH) -> tuple[Any, int] | None:
    """The JSON value starting at `text[start]` and where it ends, or None; never raises.

    The depth check scans from `start` only as far as the nesting limit allows, so calling this at many starts
    stays linear as long as the caller bounds the number of starts.
    """
    try:
        return DECODER.raw_decode(text, start)
    except RecursionError:
        return None
    except ValueError:  # JSONDecodeError, JSONLimitError, int/float bounds
        return None


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate, which `dumps_line` would write as U+FFFD (so it never reads back
    equal: an id must be refused before it becomes a key)."""
    return _LONE_SURROGATE.search(text) is not None


def scrub(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, so it encodes as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def dumps_line(record: Any) -> str:
    """One JSONL line (with its newline): non-ASCII kept, always valid UTF-8, non-finite floats written as null
    (so `loads` reads back every line written)."""
    try:
        text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False)
    return scrub(text) + "\n"
