"""The MAPS roles' outputs: a JSON schema for each (sent for constrained decoding) and a parser with a defined
fallback, so a malformed output never stops a run.

Every string is bounded by `maxLength` and every array by `maxItems`: small models under constrained decoding
otherwise repeat a string until the token limit. A parse is `ok` only when the text held JSON that satisfies the
schema; anything recovered otherwise (a field cut off mid-string, list lines in prose, the role's fallback) is
used but counted as a parse failure, so SFT filtering can keep only clean teacher outputs. A string with no
letter or digit (a placeholder such as "..." copied from the prompt, or ", ") counts as missing.
"""

from __future__ import annotations

import re
import string
from typing import Any

from maps_train.agents.jsonparse import (
    Parsed,
    clean_text,
    extract_bool_field,
    extract_string_field,
    extract_string_list,
    find_json_object,
    list_items,
)


def has_content(value: object) -> bool:
    """A string that says something: at least one letter or digit (any script)."""
    return isinstance(value, str) and any(ch.isalnum() for ch in value)


# Character bounds of each field (also what the prompts promise the model).
DIRECTION_MAX_CHARS = 300
QUERY_MAX_CHARS = 200
OBSERVATION_MAX_CHARS = 800
STATE_MAX_CHARS = 1200
ANSWER_MAX_CHARS = 200


def _string(max_chars: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_chars}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def directions_schema(n: int) -> dict[str, Any]:
    items = {"type": "array", "items": _string(DIRECTION_MAX_CHARS), "minItems": n, "maxItems": n}
    return _object({"directions": items})


def query_schema() -> dict[str, Any]:
    return _object({"query": _string(QUERY_MAX_CHARS)})


def queries_schema(n: int) -> dict[str, Any]:
    return _object({"queries": {"type": "array", "items": _string(QUERY_MAX_CHARS), "minItems": n, "maxItems": n}})


def consolidation_schema() -> dict[str, Any]:
    return _object(
        {
            "observation": _string(OBSERVATION_MAX_CHARS),
            "state": _string(STATE_MAX_CHARS),
            "sufficient": {"type": "boolean"},
        }
    )


def option_letters(num_options: int) -> list[str]:
    return list(string.ascii_uppercase[:num_options])


def answer_schema(letters: list[str] | None = None) -> dict[str, Any]:
    """Short answer: a bounded string; multiple choice: one of the option letters."""
    if letters:
        return _object({"answer": {"type": "string", "enum": list(letters)}})
    return _object({"answer": _string(ANSWER_MAX_CHARS)})


def _dedupe(items: list[str]) -> list[str]:
    seen, out = set(), []
    for item in items:
        key = " ".join(item.lower().split())
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def parse_string_list(text: str, key: str, n: int, max_chars: int, fallback: str) -> Parsed:
    """A list of exactly `n` strings under `key` (directions, direct sub-queries).

    Recovery order: the JSON list (trimmed to `n`), a cut-off JSON list, list lines in prose, then `[fallback]`.
    """
    obj = find_json_object(text)
    raw_items = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(raw_items, list):
        items = [clean_text(v, max_chars) for v in raw_items if has_content(v)]
        unique = _dedupe(items)
        if items and len(raw_items) == n and len(items) == n:
            notes = ["duplicate items dropped"] if len(unique) < len(items) else []
            return Parsed({key: unique}, ok=True, notes=notes)
        if unique:
            return Parsed(
                {key: unique[:n]}, ok=False, error=f"expected {n} non-empty strings in '{key}', got {len(items)}"
            )
    recovered = extract_string_list(text, key) or list_items(text)
    recovered = _dedupe([clean_text(v, max_chars) for v in recovered if has_content(v)])[:n]
    if recovered:
        return Parsed(
            {key: recovered}, ok=False, error=f"no valid JSON '{key}' list; recovered {len(recovered)} from text"
        )
    return Parsed({key: [fallback]}, ok=False, error=f"no '{key}' found; fallback: the question itself")


def parse_directions(text: str, n: int, question: str) -> Parsed:
    return parse_string_list(text, "directions", n, DIRECTION_MAX_CHARS, fallback=question)


def parse_queries(text: str, n: int, question: str) -> Parsed:
    return parse_string_list(text, "queries", n, QUERY_MAX_CHARS, fallback=question)


def parse_query(text: str, direction: str) -> Parsed:
    obj = find_json_object(text)
    value = obj.get("query") if isinstance(obj, dict) else None
    if has_content(value):
        return Parsed({"query": clean_text(value, QUERY_MAX_CHARS)}, ok=True)
    partial = extract_string_field(text, "query")
    if has_content(partial):
        return Parsed({"query": clean_text(partial, QUERY_MAX_CHARS)}, ok=False, error="broken JSON; 'query' recovered")
    fallback = clean_text(direction, QUERY_MAX_CHARS)
    return Parsed({"query": fallback}, ok=False, error="no 'query' found; fallback: the direction text")


def parse_consolidation(text: str, previous_state: str, fallback_observation: str) -> Parsed:
    """{"observation", "state", "sufficient"}; missing pieces: observation from the raw prose or the evidence,
    the state unchanged, not sufficient (so a broken output can only cost a round, never end the search)."""
    obj = find_json_object(text)
    if isinstance(obj, dict):
        observation, state, sufficient = obj.get("observation"), obj.get("state"), obj.get("sufficient")
        if has_content(observation) and has_content(state) and isinstance(sufficient, bool):
            value = {
                "observation": clean_text(observation, OBSERVATION_MAX_CHARS),
                "state": clean_text(state, STATE_MAX_CHARS),
                "sufficient": sufficient,
            }
            return Parsed(value, ok=True)
    else:
        observation = extract_string_field(text, "observation")
        state = extract_string_field(text, "state")
        sufficient = extract_bool_field(text, "sufficient")
    missing = []
    if not has_content(observation):
        missing.append("observation")
        prose = clean_text(text, OBSERVATION_MAX_CHARS)
        # Prose is a usable observation; broken JSON, a placeholder or nothing is not.
        usable = has_content(prose) and not prose.lstrip().startswith(("{", "[", "```"))
        observation = prose if usable else fallback_observation
    if not has_content(state):
        missing.append("state")
        state = previous_state
    if isinstance(sufficient, str):
        sufficient = sufficient.strip().lower() in ("true", "yes")
    if not isinstance(sufficient, bool):
        missing.append("sufficient")
        sufficient = False
    value = {
        "observation": clean_text(observation, OBSERVATION_MAX_CHARS),
        "state": clean_text(state, STATE_MAX_CHARS) if state else "",
        "sufficient": sufficient,
    }
    what = ", ".join(missing) if missing else "field types"
    return Parsed(value, ok=False, error=f"invalid consolidator JSON ({what}); fallback used")


_LETTER = re.compile(r"^\s*[\(\[]?([A-Za-z])[\)\].:]?\s*$")


def parse_answer(text: str, letters: list[str] | None = None) -> Parsed:
    """{"answer": ...}; choice mode also accepts "(B)", "B." and finds a lone letter in prose."""
    obj = find_json_object(text)
    value = obj.get("answer") if isinstance(obj, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.strip():
        if not letters:
            return Parsed({"answer": clean_text(value, ANSWER_MAX_CHARS)}, ok=True)
        match = _LETTER.match(value)
        if match and match.group(1).upper() in letters:
            exact = value.strip() in letters
            return Parsed({"answer": match.group(1).upper()}, ok=exact, error=None if exact else "letter decorated")
    if value is None:
        value = extract_string_field(text, "answer")
    if letters:
        for candidate in (value or "", text):
            match = re.search(r"\b([" + "".join(letters) + r"])\b", candidate)
            if match:
                return Parsed({"answer": match.group(1)}, ok=False, error="no valid JSON answer; letter found in text")
        return Parsed(
            {"answer": clean_text(text, ANSWER_MAX_CHARS)}, ok=False, error="no option letter found; raw text"
        )
    if isinstance(value, str) and value.strip():
        return Parsed(
            {"answer": clean_text(value, ANSWER_MAX_CHARS)}, ok=False, error="broken JSON; 'answer' recovered"
        )
    return Parsed({"answer": clean_text(text, ANSWER_MAX_CHARS)}, ok=False, error="no 'answer' found; raw text")
