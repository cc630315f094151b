"""The MAPS roles' outputs: a JSON schema for each (sent for constrained decoding) and a parser with a defined
fallback, so a malformed output never stops a run.

Every string is bounded by `maxLength` and every array by `maxItems`: small models under constrained decoding
otherwise repeat a string until the token limit. A parse is `ok` exactly when the text held JSON valid against
the role's schema -- the very schema function whose output is sent for constrained decoding -- and every string
in it has a letter or digit once thinking tags and whitespace are removed (a placeholder such as "..." copied from
the prompt, ", " or "<think>" counts as missing). Anything else (a Python-style dict, an extra key, a string over
`maxLength`, a number where a string belongs, a field cut off mid-string, list lines in prose, the role's
fallback) is used but counted as a parse failure, so SFT filtering can keep only clean teacher outputs. Parsers
never raise and run in linear time (see `jsonparse`); every value they return is bounded and encodes as UTF-8.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

from maps_train.agents.jsonparse import (
    Found,
    Parsed,
    bounded,
    clean_text,
    cut_notes,
    extract_bool_field,
    extract_string_field,
    extract_string_list,
    find_object,
    has_content,
    list_items,
    output_error,
)

# Character bounds of each field (also what the prompts promise the model).
DIRECTION_MAX_CHARS = 300
QUERY_MAX_CHARS = 200
OBSERVATION_MAX_CHARS = 800
STATE_MAX_CHARS = 1200
ANSWER_MAX_CHARS = 200
BASELINE_QUERY_MAX_CHARS = 1000  # the baselines' free-text queries (their prompts set no bound); longer ones are cut


# The separators of the JSON a deployed role writes: vLLM's xgrammar backend under `disable_any_whitespace`
# (`llm.vllm_backend`, `serve.plan`) allows no whitespace between tokens. A training target written otherwise
# (`{"query": "x"}`) is text the student cannot produce under its own decoding.
DEPLOYED_JSON_SEPARATORS = (",", ":")


# xgrammar compiles a string with `maxLength` (every string of the schemas below has one) to characters that need
# no escape: a deployed role never writes `"`, `\` or a control character inside a string. A target holding one
# teaches text the student cannot produce; each is written as the nearest character it can.
_UNWRITABLE = str.maketrans({'"': "'", "\\": "/", **{chr(code): " " for code in range(32)}})


def _writable(value: Any) -> Any:
    if isinstance(value, str):
        return value.translate(_UNWRITABLE)
    if isinstance(value, list):
        return [_writable(item) for item in value]
    if isinstance(value, dict):
        return {key: _writable(item) for key, item in value.items()}
    return value


def deployed_json(value: dict[str, Any]) -> str:
    """`value` as the deployed decoding can write a role's JSON: no whitespace between tokens, non-ASCII kept, no
    character inside a string that would need an escape (`_UNWRITABLE`)."""
    return json.dumps(_writable(value), ensure_ascii=False, separators=DEPLOYED_JSON_SEPARATORS)


def as_deployed_json(text: str) -> str:
    """`text` rewritten by `deployed_json` when the whole of it is one JSON object (a teacher that wrote spaces,
    key order kept); any other text as it is."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return deployed_json(value) if isinstance(value, dict) else text


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


def _field(value: object, max_chars: int) -> str | None:
    """A model string cleaned for reuse (`clean_text`), or None when it is not a string or says nothing."""
    if not isinstance(value, str):
        return None
    cleaned = clean_text(value, max_chars)
    return cleaned if has_content(cleaned) else None


def _fields(values: list[object], max_chars: int) -> list[str]:
    return _dedupe([item for item in (_field(value, max_chars) for value in values) if item])


def _get(found: Found | None, key: str) -> object:
    return found.value.get(key) if found else None


def parse_string_list(
    text: str, key: str, n: int, max_chars: int, fallback: str, schema: dict[str, Any] | None = None
) -> Parsed:
    """A list of exactly `n` strings under `key` (directions, direct sub-queries), checked against `schema`.

    Recovery order: the JSON list (cleaned, deduplicated, trimmed to `n`), a cut-off JSON list, list lines in
    prose, then `[fallback]`. Duplicates in a valid list are dropped without failing the parse."""
    schema = schema or _object({key: {"type": "array", "items": _string(max_chars), "minItems": n, "maxItems": n}})
    notes = cut_notes(text)
    found = find_object(text)
    problem = output_error(found, schema, text)
    raw_items = _get(found, key)
    if isinstance(raw_items, list):
        items = _fields(raw_items, max_chars)
        if problem is None and items:
            if len(items) < len(raw_items):
                notes.append("duplicate items dropped")
            return Parsed({key: items}, ok=True, notes=notes)
        if items:
            return Parsed(
                {key: items[:n]}, ok=False, error=f"invalid '{key}' JSON ({problem}); its items used", notes=notes
            )
    recovered = _fields(extract_string_list(text, key) or list_items(text), max_chars)[:n]
    if recovered:
        error = f"{problem}; recovered {len(recovered)} '{key}' item(s) from the text"
        return Parsed({key: recovered}, ok=False, error=error, notes=notes)
    error = f"{problem}; no '{key}' found, fallback: the question itself"
    return Parsed({key: [clean_text(fallback, max_chars)]}, ok=False, error=error, notes=notes)


def parse_directions(text: str, n: int, question: str) -> Parsed:
    return parse_string_list(text, "directions", n, DIRECTION_MAX_CHARS, question, directions_schema(n))


def parse_queries(text: str, n: int, question: str) -> Parsed:
    return parse_string_list(text, "queries", n, QUERY_MAX_CHARS, question, queries_schema(n))


def parse_query(text: str, direction: str) -> Parsed:
    """{"query"}; else a `"query": "...` cut off in broken JSON; else the direction itself."""
    notes = cut_notes(text)
    found = find_object(text)
    problem = output_error(found, query_schema(), text)
    query = _field(_get(found, "query"), QUERY_MAX_CHARS)
    if query and problem is None:
        return Parsed({"query": query}, ok=True, notes=notes)
    if query:
        return Parsed({"query": query}, ok=False, error=f"invalid query JSON ({problem}); 'query' used", notes=notes)
    partial = _field(extract_string_field(text, "query"), QUERY_MAX_CHARS)
    if partial:
        return Parsed({"query": partial}, ok=False, error=f"{problem}; 'query' recovered from the text", notes=notes)
    fallback = clean_text(direction, QUERY_MAX_CHARS)
    return Parsed({"query": fallback}, ok=False, error=f"{problem}; fallback: the direction text", notes=notes)


def said_sufficient(claimed: object) -> bool | None:
    """What a `sufficient` field says: a JSON boolean, or the strings "true"/"false"/"yes"/"no" (any case)."""
    if isinstance(claimed, bool):
        return claimed
    if isinstance(claimed, str):
        return {"true": True, "yes": True, "false": False, "no": False}.get(claimed.strip().lower())
    return None


def parse_consolidation(text: str, previous_state: str, fallback_observation: str) -> Parsed:
    """{"observation", "state", "sufficient"}; missing pieces: observation from the raw prose or the evidence,
    the state unchanged. A parse that is not ok never says sufficient: a broken or repaired output (a string
    "true", JSON cut off after `"sufficient": true`, an extra key) can cost a round, never end the search; what
    it claimed is kept in the notes."""
    notes = cut_notes(text)
    found = find_object(text)
    problem = output_error(found, consolidation_schema(), text)
    if found:
        observation, state, claimed = (found.value.get(key) for key in ("observation", "state", "sufficient"))
    else:
        observation, state = extract_string_field(text, "observation"), extract_string_field(text, "state")
        claimed = extract_bool_field(text, "sufficient")
    observation, state = _field(observation, OBSERVATION_MAX_CHARS), _field(state, STATE_MAX_CHARS)
    if problem is None and observation and state and isinstance(claimed, bool):
        return Parsed({"observation": observation, "state": state, "sufficient": claimed}, ok=True, notes=notes)
    missing = []
    if not observation:
        missing.append("observation")
        prose = clean_text(text, OBSERVATION_MAX_CHARS)
        # Prose is a usable observation; broken JSON, a placeholder or nothing is not.
        usable = has_content(prose) and not prose.startswith(("{", "[", "```"))
        observation = prose if usable else clean_text(fallback_observation, OBSERVATION_MAX_CHARS)
    if not state:
        missing.append("state")
        state = clean_text(previous_state, STATE_MAX_CHARS) if isinstance(previous_state, str) else ""
    said = said_sufficient(claimed)
    if said is None:
        missing.append("sufficient")
    elif said:
        notes.append("'sufficient' said true in an output that failed to parse: read as false")
    repaired = f"fallback used for {', '.join(missing)}" if missing else "fields repaired"
    value = {"observation": observation, "state": state, "sufficient": False}
    return Parsed(value, ok=False, error=f"invalid consolidator JSON ({problem}); {repaired}", notes=notes)


_LETTER = re.compile(r"\s*[\(\[]?([A-Za-z])[\)\].:]?\s*")


def _answer_string(value: object) -> str | None:
    """The answer field as text: a string, or a finite number written out (a counted repair: not a string)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
        return str(value)
    return None


def parse_answer(text: str, letters: list[str] | None = None) -> Parsed:
    """{"answer": ...} against `answer_schema(letters)`. Short answer: the string (a number is written out but
    not ok); else a cut-off `"answer": "...`; else the raw text. Choice: the option letter, also from "(B)" or
    "B." (not ok), else the first standalone option letter in the answer or the text; else the raw text."""
    notes = cut_notes(text)
    found = find_object(text)
    problem = output_error(found, answer_schema(letters), text)
    answer = _answer_string(_get(found, "answer"))
    if letters:
        return _parse_choice(text, answer, problem, letters, notes)
    cleaned = _field(answer, ANSWER_MAX_CHARS)
    if cleaned and problem is None:
        return Parsed({"answer": cleaned}, ok=True, notes=notes)
    if cleaned:
        return Parsed(
            {"answer": cleaned}, ok=False, error=f"invalid answer JSON ({problem}); 'answer' used", notes=notes
        )
    partial = _field(extract_string_field(text, "answer"), ANSWER_MAX_CHARS)
    if partial:
        return Parsed({"answer": partial}, ok=False, error=f"{problem}; 'answer' recovered from the text", notes=notes)
    raw = clean_text(text, ANSWER_MAX_CHARS) if isinstance(text, str) else ""
    return Parsed({"answer": raw}, ok=False, error=f"{problem}; no 'answer' found, the raw text used", notes=notes)


def _parse_choice(text: str, answer: str | None, problem: str | None, letters: list[str], notes: list[str]) -> Parsed:
    if answer is not None:
        match = _LETTER.fullmatch(answer)
        if match and match.group(1).upper() in letters:
            letter = match.group(1).upper()
            if problem is None:
                return Parsed({"answer": letter}, ok=True, notes=notes)
            return Parsed(
                {"answer": letter}, ok=False, error=f"invalid answer JSON ({problem}); letter used", notes=notes
            )
    if answer is None:
        answer = extract_string_field(text, "answer")
    standalone = re.compile(r"\b([" + "".join(re.escape(letter) for letter in letters) + r"])\b")
    for candidate in (answer or "", bounded(text)):
        match = standalone.search(candidate)
        if match:
            error = f"{problem}; option letter found in the text"
            return Parsed({"answer": match.group(1)}, ok=False, error=error, notes=notes)
    raw = clean_text(text, ANSWER_MAX_CHARS) if isinstance(text, str) else ""
    return Parsed({"answer": raw}, ok=False, error=f"{problem}; no option letter found, the raw text used", notes=notes)
