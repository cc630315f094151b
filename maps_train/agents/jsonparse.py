"""Tolerant reading of model output that was asked to be JSON.

Constrained decoding makes most outputs valid, but not all backends constrain, and small or truncated outputs
still arrive as prose, fenced code, Python-style dicts or JSON cut off at the token limit. These helpers find
what can be found; they never raise.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\(?\d{1,2}[.):])\s+(.+?)\s*$")


@dataclass
class Parsed:
    """A role's output: `value` is always usable (from the JSON, or from the role's fallback)."""

    value: dict[str, Any]
    ok: bool  # the text held JSON satisfying the role's schema
    error: str | None = None  # what was wrong, and which fallback produced `value`
    notes: list[str] = field(default_factory=list)


def strip_thinking(text: str) -> str:
    """Drop Qwen3 `<think>` blocks left in the text (a backend without a reasoning parser), and an unclosed one."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()


def _balanced_object(text: str, start: int) -> str | None:
    """The `{...}` starting at `start`, matching braces outside string literals (either quote style)."""
    depth, quote, escaped = 0, None, False
    for i in range(start, len(text)):
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


def find_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`: plain, inside a code fence, followed by garbage, or single-quoted."""
    if not text:
        return None
    text = strip_thinking(text)
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for match in re.finditer(r"\{", candidate):
            try:
                value, _ = decoder.raw_decode(candidate, match.start())
            except json.JSONDecodeError:
                value = None
            if isinstance(value, dict):
                return value
            # Python-style dicts ('single quotes', True/False) from models imitating code.
            chunk = _balanced_object(candidate, match.start())
            if chunk is not None and "'" in chunk:
                try:
                    value = ast.literal_eval(chunk)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    value = None
                if isinstance(value, dict):
                    return value
    return None


def _key(key: str) -> str:
    """A pattern for a quoted JSON key, either quote style."""
    return "[\"']" + re.escape(key) + "[\"']"


def extract_string_field(text: str, key: str) -> str | None:
    """The value of `"key": "..."` even when the JSON around it is broken or cut off mid-string."""
    match = re.search(_key(key) + r"""\s*:\s*(["'])""", text)
    if not match:
        return None
    quote = match.group(1)
    out, escaped = [], False
    for char in text[match.end() :]:
        if escaped:
            out.append({"n": "\n", "t": "\t"}.get(char, char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == quote:
            break
        else:
            out.append(char)
    value = "".join(out).strip()
    return value or None


def extract_bool_field(text: str, key: str) -> bool | None:
    match = re.search(_key(key) + r"""\s*:\s*["']?(true|false|yes|no)\b""", text, re.IGNORECASE)
    if not match:
        return None
    return match.group(1).lower() in ("true", "yes")


def extract_string_list(text: str, key: str) -> list[str]:
    """The strings of `"key": [ "...", "..." ]`, tolerating a cut-off list."""
    match = re.search(_key(key) + r"""\s*:\s*\[""", text)
    if not match:
        return []
    tail = text[match.end() :]
    tail = tail.split("]", 1)[0]
    return [m.group(2).strip() for m in re.finditer(r"""(["'])((?:\\.|(?!\1).)*)\1""", tail) if m.group(2).strip()]


def list_items(text: str) -> list[str]:
    """Lines that look like list items ("1. ...", "- ...") in prose output."""
    items = []
    for line in strip_thinking(text).splitlines():
        match = _LIST_ITEM.match(line)
        if match:
            items.append(match.group(1).strip().strip("\"'"))
    return [item for item in items if item]


def clean_text(text: str, max_chars: int) -> str:
    """Model prose made safe to reuse as a field: no thinking, whitespace collapsed, bounded length."""
    text = re.sub(r"\s+", " ", strip_thinking(text)).strip()
    return text[:max_chars].strip()
