"""Tolerant, bounded reading of model output: JSON objects (the MAPS roles), tagged spans (the baselines), and a
validator for the JSON Schema subset the role schemas use.

Constrained decoding makes most outputs valid, but not all backends constrain, and small or truncated outputs
still arrive as prose, fenced code, Python-style dicts or JSON cut off at the token limit. These helpers find
what can be found, and every one of them
- never raises on any string;
- runs in time linear in its input: the input is cut to `MAX_INPUT_CHARS` before any regex, no pattern nests
  quantifiers or scans to the end of the text once per match attempt, at most `MAX_JSON_STARTS` positions are
  tried as JSON starts and their character scans read at most `MAX_SCAN_CHARS` together, JSON goes through
  `maps_train.safejson` (bounded depth and integers) and Python literals are evaluated only in small, shallow
  chunks;
- returns strings without lone surrogates (`bounded` and `clean_text` replace them).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from maps_train import safejson

MAX_INPUT_CHARS = 64 * 1024  # a role output is a few hundred tokens; longer text is cut (and noted), never fatal
MAX_JSON_STARTS = 32  # `{` positions tried as the start of an object, over all candidate texts
# Characters the nesting and literal scans of all JSON starts read together. Each scan may run to the end of the
# text (an unclosed value), so without a shared bound 32 starts read 32 times the input. Twice the input bound:
# the first start may read a whole input and the others as much again.
MAX_SCAN_CHARS = 2 * MAX_INPUT_CHARS
MAX_FENCES = 8  # ``` code blocks looked into
MAX_LITERAL_CHARS = 8 * 1024  # a Python-style dict longer than this is not evaluated
MAX_DEPTH = 16  # role objects nest 2 levels; deeper text is not decoded

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FENCE = "```"
# A list line in prose: a bullet or a 1-2 digit number, then the item. `\s+(\S.*)` cannot backtrack into the
# whitespace run (the item must start on a non-space), so a long run of spaces costs linear time.
_LIST_ITEM = re.compile(r"\s*(?:[-*\u2022]|\(?\d{1,2}[.):])\s+(\S.*)")
_WHITESPACE = re.compile(r"\s+")


@dataclass
class Parsed:
    """A role's output: `value` is always usable (from the JSON, or from the role's fallback)."""

    value: dict[str, Any]
    ok: bool  # the text held JSON valid against the role's schema, every string with a letter or digit
    error: str | None = None  # what was wrong, and which fallback produced `value`
    notes: list[str] = field(default_factory=list)


# -- input bounds --------------------------------------------------------------------------------------------------


def bounded(text: object, keep: str = "head") -> str:
    """`text` cut to `MAX_INPUT_CHARS` (its start, or its end when `keep="tail"`), lone surrogates replaced.
    Anything that is not a string reads as empty text."""
    if not isinstance(text, str):
        return ""
    if len(text) > MAX_INPUT_CHARS:
        text = text[:MAX_INPUT_CHARS] if keep == "head" else text[-MAX_INPUT_CHARS:]
    return safejson.scrub(text)


def cut_notes(text: object) -> list[str]:
    """The note a parser adds when its input was longer than it reads."""
    if isinstance(text, str) and len(text) > MAX_INPUT_CHARS:
        return [f"input of {len(text)} characters cut to {MAX_INPUT_CHARS}"]
    return []


# -- thinking, whitespace ------------------------------------------------------------------------------------------


def strip_thinking(text: str) -> str:
    """Drop Qwen3 `<think>` blocks left in the text (a backend without a reasoning parser): every closed block,
    then everything up to a stray `</think>`, then an unclosed block. One left-to-right pass of `str.find`."""
    kept, position = [], 0
    while True:
        start = text.find(THINK_OPEN, position)
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN)) if start >= 0 else -1
        if end < 0:  # no further block closes (an unclosed one is cut below)
            kept.append(text[position:])
            break
        kept.append(text[position:start])
        position = end + len(THINK_CLOSE)
    text = "".join(kept)
    if THINK_CLOSE in text:
        text = text.split(THINK_CLOSE, 1)[1]
    if THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[0]
    return text.strip()


def clean_text(text: str, max_chars: int) -> str:
    """Model prose made safe to reuse as a field: no thinking, whitespace collapsed, bounded length, no lone
    surrogates."""
    text = _WHITESPACE.sub(" ", strip_thinking(safejson.scrub(text))).strip()
    return text[:max_chars].strip()


def has_content(value: object) -> bool:
    """A string that says something: at least one letter or digit (any script)."""
    return isinstance(value, str) and any(ch.isalnum() for ch in value)


# -- JSON objects --------------------------------------------------------------------------------------------------


@dataclass
class Found:
    """An object found in model text; `is_json` False: it was a Python-style literal (a counted repair)."""

    value: dict[Any, Any]
    is_json: bool


def fenced_blocks(text: str) -> list[str]:
    """The contents of the first `MAX_FENCES` closed ``` blocks, a `json` label dropped."""
    blocks, position = [], 0
    while len(blocks) < MAX_FENCES:
        start = text.find(FENCE, position)
        end = text.find(FENCE, start + len(FENCE)) if start >= 0 else -1
        if end < 0:
            break
        body = text[start + len(FENCE) : end]
        if body[:4] in ("json", "JSON"):
            body = body[4:]
        blocks.append(body.strip())
        position = end + len(FENCE)
    return blocks


# A bracket, or a whole string literal (escapes included, possibly never closed): the nesting scan steps over a
# string in one match, so brackets inside strings cost no Python-level step. The unrolled `[^"\\]*(?:\\.[^"\\]*)*`
# cannot backtrack (each character has one way to match).
_JSON_TOKEN = re.compile(r'[\[\]{}]|"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)


def _exceeds_depth_within(text: str, start: int, scan_end: int) -> tuple[bool | None, int]:
    """Whether the JSON value at `text[start]` nests deeper than `MAX_DEPTH`: True, or False when it closes (or the
    text ends) within that depth, reading no further than `scan_end`; None when `scan_end` came first. Also where
    the scan stopped, so the caller can charge what was read.

    The same verdict as `safejson.exceeds_depth`, which has no bound on how far one start reads; checked before
    decoding, as the C decoder recurses once per level."""
    if text.count("{", start) + text.count("[", start) <= MAX_DEPTH:  # too few brackets: no scan (C speed)
        return False, start
    depth = 0
    for match in _JSON_TOKEN.finditer(text, start, scan_end):
        char = text[match.start()]  # not `match.group()`: that would copy every string literal
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True, match.end()
        elif char in "]}":
            depth -= 1
            if depth <= 0:
                return False, match.end()
    if scan_end >= len(text):  # ran to the end of the text without closing: not too deep
        return False, len(text)
    return None, scan_end


def _braced_chunk(text: str, start: int, max_chars: int) -> str | None:
    """The `{...}` starting at `start` within `max_chars`, braces matched outside string literals (either quote
    style), or None."""
    depth, quote, escaped = 0, None, False
    for i in range(start, min(len(text), start + max_chars)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


_PYTHON_MARKS = ("'", "True", "False", "None")


def _python_literal_at(text: str, start: int, max_chars: int = MAX_LITERAL_CHARS) -> tuple[dict[Any, Any] | None, int]:
    """A Python-style dict ('single quotes', True/False/None) from a model imitating code, and how many characters
    the brace scan read. Bounded: a chunk of at most `max_chars` (no more than `MAX_LITERAL_CHARS`) with at most
    `MAX_DEPTH` brackets (the parser recurses per bracket), and any error of the evaluation (ValueError, TypeError
    for `{[]: 1}`, SyntaxError, MemoryError, RecursionError) is a miss."""
    window = text[start : start + min(max_chars, MAX_LITERAL_CHARS)]
    if not any(mark in window for mark in _PYTHON_MARKS):  # checked at C speed before the character loop
        return None, 0
    chunk = _braced_chunk(window, 0, len(window))
    if chunk is None:
        return None, len(window)
    if sum(chunk.count(bracket) for bracket in "{[(") > MAX_DEPTH:
        return None, len(chunk)
    try:
        value = ast.literal_eval(chunk)
    except Exception:  # literal_eval's error types are open-ended; none of them may escape a parser
        return None, len(chunk)
    return (value if isinstance(value, dict) else None), len(chunk)


def find_object(text: str) -> Found | None:
    """The first object in `text` (thinking removed): plain, in a ``` block, amid prose, or single-quoted.

    Fenced blocks are tried first, then the whole text; in each, `{` positions from the left, JSON before a Python
    literal at each position, at most `MAX_JSON_STARTS` positions in all, whose scans read at most
    `MAX_SCAN_CHARS` characters together (the search ends when they are spent)."""
    text = strip_thinking(bounded(text))
    starts_left, chars_left = MAX_JSON_STARTS, MAX_SCAN_CHARS
    for candidate in [*fenced_blocks(text), text]:
        start = candidate.find("{")
        while start >= 0 and starts_left > 0:
            starts_left -= 1
            deep, scanned_to = _exceeds_depth_within(candidate, start, start + chars_left)
            chars_left -= scanned_to - start
            if deep is None:
                return None
            decoded = None if deep else safejson.raw_decode(candidate, start, MAX_DEPTH)
            if decoded is not None and isinstance(decoded[0], dict):
                return Found(decoded[0], is_json=True)
            value, scanned = _python_literal_at(candidate, start, chars_left)
            chars_left -= scanned
            if value is not None:
                return Found(value, is_json=False)
            start = candidate.find("{", start + 1)
    return None


def find_json_object(text: str) -> dict[Any, Any] | None:
    """The first object in `text` (see `find_object`), JSON or Python-style."""
    found = find_object(text)
    return found.value if found else None


# -- fields of broken JSON -----------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _key_pattern(key: str, tail: str, flags: int = 0) -> re.Pattern[str]:
    """A quoted key (either quote style), a colon, then `tail`."""
    return re.compile("[\"']" + re.escape(key) + "[\"']" + r"\s*:\s*" + tail, flags)


def _read_string(text: str, start: int, quote: str) -> tuple[str, int]:
    """The string body from `start` up to the closing `quote` (backslash escapes read), and the index after it
    (`len(text) + 1` when it never closes)."""
    out, escaped = [], False
    for i in range(start, len(text)):
        char = text[i]
        if escaped:
            out.append({"n": "\n", "t": "\t"}.get(char, char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == quote:
            return "".join(out), i + 1
        else:
            out.append(char)
    return "".join(out), len(text) + 1


def extract_string_field(text: str, key: str) -> str | None:
    """The value of `"key": "..."` even when the JSON around it is broken or cut off mid-string."""
    text = bounded(text)
    match = _key_pattern(key, "([\"'])").search(text)
    if not match:
        return None
    value, _ = _read_string(text, match.end(), match.group(1))
    return value.strip() or None


def extract_bool_field(text: str, key: str) -> bool | None:
    """`"key": true` (or "yes", quoted or not) in broken JSON."""
    match = _key_pattern(key, r"[\"']?(true|false|yes|no)\b", re.IGNORECASE).search(bounded(text))
    if not match:
        return None
    return match.group(1).lower() in ("true", "yes")


def extract_string_list(text: str, key: str) -> list[str]:
    """The strings of `"key": [ "...", "..." ]`, tolerating a cut-off list (an unclosed last string is dropped).
    One pass over the characters: strings are read with `_read_string`, the list ends at a `]` outside them."""
    text = bounded(text)
    match = _key_pattern(key, r"\[").search(text)
    if not match:
        return []
    items, i = [], match.end()
    while i < len(text) and text[i] != "]":
        if text[i] in "\"'":
            value, i = _read_string(text, i + 1, text[i])
            if i <= len(text) and value.strip():
                items.append(value.strip())
        else:
            i += 1
    return items


def list_items(text: str) -> list[str]:
    """Lines that look like list items ("1. ...", "- ...") in prose output."""
    items = []
    for line in strip_thinking(bounded(text)).splitlines():
        match = _LIST_ITEM.match(line)
        if match:
            items.append(match.group(1).strip().strip("\"'"))
    return [item for item in items if item]


# -- tags (the baselines' formats) ---------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _tag_pattern(opener: str, closer: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(f"({re.escape(opener)})|{re.escape(closer)}", re.IGNORECASE if ignore_case else 0)


def tag_contents(text: str, opener: str, closer: str, ignore_case: bool = False) -> list[str]:
    """What `re.findall(opener + "(.*?)" + closer, text, re.DOTALL)` finds, in one pass over the tags: each
    opener pairs with the first closer after it (an opener inside an open span is content), and a span that
    never closes is dropped. The lazy regex instead rescans to the end of the text from every unclosed opener."""
    contents, start = [], None
    for match in _tag_pattern(opener, closer, ignore_case).finditer(text):
        if match.group(1) is not None:
            if start is None:
                start = match.end()
        elif start is not None:
            contents.append(text[start : match.start()])
            start = None
    return contents


def first_tag_content(text: str, opener: str, closer: str) -> str | None:
    """The content of the first closed `opener ... closer` span (case-sensitive), or None. Only the first opener
    matters: if it never closes, no later one does."""
    start = text.find(opener)
    if start < 0:
        return None
    end = text.find(closer, start + len(opener))
    return text[start + len(opener) : end] if end >= 0 else None


# -- schema validation ---------------------------------------------------------------------------------------------

_SCHEMA_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list, "string": str, "boolean": bool}
_SCHEMA_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
     "maxLength", "enum"}
)  # fmt: skip


class UnsupportedSchemaError(ValueError):
    """A role schema uses a JSON Schema keyword `schema_error` does not check (a programming error)."""


def _show(key: object) -> str:
    """A key as it appears in an error message: short, printable, encodable."""
    return safejson.scrub(repr(key)[:40])


def schema_error(value: Any, schema: dict[str, Any], where: str = "$") -> str | None:
    """Why `value` is not valid against `schema` (None when it is), for the subset of JSON Schema the role
    schemas use: type (object, array, string, boolean), properties, required, additionalProperties: false, items,
    minItems/maxItems, minLength/maxLength, enum. A keyword outside it raises `UnsupportedSchemaError`, so a
    schema change cannot silently weaken the check (tests validate every role schema).

    Kept rather than jsonschema's Draft202012Validator (the property tests compare the two on every generated
    object): jsonschema ignores a keyword it does not know (a mistyped `maxlength` checks nothing) and builds
    every error from `repr(instance)` even in `is_valid`, which raises RecursionError on a 100,000-deep list and
    is several times slower on role objects (docs/throughput.md, "Figures the code's comments rest on")."""
    unknown = set(schema) - _SCHEMA_KEYWORDS
    if unknown:
        raise UnsupportedSchemaError(f"schema keyword(s) {sorted(unknown)} at {where} are not supported")
    kind = schema.get("type")
    if kind is not None and kind not in _SCHEMA_TYPES:
        raise UnsupportedSchemaError(f"schema type {kind!r} at {where} is not supported")
    if kind is not None and not isinstance(value, _SCHEMA_TYPES[kind]):
        return f"{where}: expected {kind}, got {type(value).__name__}"
    if "enum" in schema and not any(type(value) is type(option) and value == option for option in schema["enum"]):
        return f"{where}: not one of {schema['enum']}"
    if isinstance(value, str):
        return _length_error(len(value), schema, "minLength", "maxLength", "characters", where)
    if isinstance(value, list):
        bad_count = _length_error(len(value), schema, "minItems", "maxItems", "items", where)
        if bad_count:
            return bad_count
        for index, item in enumerate(value):
            problem = schema_error(item, schema.get("items", {}), f"{where}[{index}]")
            if problem:
                return problem
    if isinstance(value, dict):
        return _object_error(value, schema, where)
    return None


def _length_error(size: int, schema: dict[str, Any], low: str, high: str, unit: str, where: str) -> str | None:
    if low in schema and size < schema[low]:
        return f"{where}: {size} {unit}, fewer than {low} {schema[low]}"
    if high in schema and size > schema[high]:
        return f"{where}: {size} {unit}, more than {high} {schema[high]}"
    return None


def _object_error(value: dict[Any, Any], schema: dict[str, Any], where: str) -> str | None:
    properties = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            return f"{where}: missing required key {_show(key)}"
    if schema.get("additionalProperties", True) is False:
        extra = [key for key in value if key not in properties]
        if extra:
            return f"{where}: unexpected key {_show(extra[0])}" + (f" (and {len(extra) - 1} more)" if extra[1:] else "")
    for key, item in value.items():
        if key in properties:
            problem = schema_error(item, properties[key], f"{where}.{key}")
            if problem:
                return problem
    return None


def content_error(value: Any, where: str = "$") -> str | None:
    """Why a schema-valid value is still not a clean output: a string that holds a lone surrogate, or that says
    nothing (no letter or digit once thinking and whitespace are removed: "...", "-", "<think>")."""
    if isinstance(value, str):
        if safejson.scrub(value) != value:
            return f"{where}: holds a lone surrogate"
        if not has_content(clean_text(value, len(value))):
            return f"{where}: no letter or digit"
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problem = content_error(item, f"{where}[{index}]")
            if problem:
                return problem
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = content_error(item, f"{where}.{key}")
            if problem:
                return problem
    return None


def output_error(found: Found | None, schema: dict[str, Any], text: str = "") -> str | None:
    """Why `found` (read from `text`) is not a clean role output for `schema` (None when `ok`): it must be JSON,
    valid against the very schema sent for constrained decoding, with content in every string, in a text that
    is valid Unicode (a lone surrogate is replaced before parsing, which is a repair)."""
    if isinstance(text, str) and safejson.scrub(text[:MAX_INPUT_CHARS]) != text[:MAX_INPUT_CHARS]:
        return "the text holds a lone surrogate"
    if found is None:
        return "no JSON object"
    if not found.is_json:
        return "a Python-style dict, not JSON"
    return schema_error(found.value, schema) or content_error(found.value)
