"""Property tests of every parser of model output (issue 15): on any text a parser returns, never raises, runs
in linear time (a per-test timeout turns a hang into a failure), and keeps the contract:
- `value` is usable: the role's keys and types, strings within their bounds, no lone surrogates, encodable as
  UTF-8 JSON (errors and notes too);
- `ok` implies the value is valid against the role's schema (the one sent for constrained decoding; checked by
  ours and by jsonschema, which also judge every generated object alike), every string
  with a letter or digit; a consolidation that is not ok never says sufficient;
- a valid object, however it is wrapped (fence, prose, thinking), parses ok to itself (round trip).
The new linear-time helpers are also checked against the regexes they replace, on inputs small enough for those.

`PARSERS` (name -> text -> contract violations) is shared with tests/test_parse_fixed.py (the fixed cases and the fuzz
corpus). A failing case is kept in the example database (.hypothesis/, git-ignored; tests/conftest.py's profile),
replayed first on the next run and printed as a `@reproduce_failure` blob.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from maps_train.agents.baselines.answers import (
    extract_answer_tag,
    extract_direct_answer,
    extract_reasoned_answer,
    last_boxed,
)
from maps_train.agents.baselines.parallel_search import MAX_SUB_QUERIES, close_open_tag, first_action, parse_action
from maps_train.agents.baselines.s3 import MAX_IMPORTANT, parse_searcher, query_text
from maps_train.agents.baselines.search_o1 import BEGIN_QUERY, END_QUERY, INFO_HEADING, parse_condensed, parse_reasoner
from maps_train.agents.baselines.vanilla import parse_direct
from maps_train.agents.jsonparse import (
    Parsed,
    content_error,
    find_json_object,
    has_content,
    list_items,
    schema_error,
    strip_thinking,
    tag_contents,
)
from maps_train.agents.outputs import (
    ANSWER_MAX_CHARS,
    BASELINE_QUERY_MAX_CHARS,
    DIRECTION_MAX_CHARS,
    OBSERVATION_MAX_CHARS,
    QUERY_MAX_CHARS,
    STATE_MAX_CHARS,
    answer_schema,
    consolidation_schema,
    directions_schema,
    parse_answer,
    parse_consolidation,
    parse_directions,
    parse_queries,
    parse_query,
    queries_schema,
    query_schema,
)
from maps_train.safejson import scrub

LETTERS = ["A", "B", "C", "D"]
N = 3  # directions / queries asked for


def budget(examples: int):
    """Hypothesis settings for one test: `examples` cases, no per-example deadline (the per-test timeout is the
    hang check); the example database and printed blobs come from tests/conftest.py's profile."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# -- the parsers and their contract ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    """A MAPS role parser with the schema its request sends."""

    parse: Callable[[str], Parsed]
    schema: dict[str, Any]


ROLES = {
    "directions": Role(lambda text: parse_directions(text, N, "Q?"), directions_schema(N)),
    "queries": Role(lambda text: parse_queries(text, N, "Q?"), queries_schema(N)),
    "query": Role(lambda text: parse_query(text, "the direction"), query_schema()),
    "consolidation": Role(
        lambda text: parse_consolidation(text, "old state", "first sentences"), consolidation_schema()
    ),
    "answer": Role(parse_answer, answer_schema()),
    "answer_choice": Role(lambda text: parse_answer(text, LETTERS), answer_schema(LETTERS)),
}


def shape_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """What every returned value satisfies, ok or not: the role's keys and types and upper bounds (a fallback
    may be an empty string or a shorter list; a choice fallback is the raw text, so no enum)."""
    shape = {key: value for key, value in schema.items() if key not in ("minLength", "enum")}
    if "minItems" in shape:
        shape["minItems"] = 1
    if "items" in shape:
        shape["items"] = shape_schema(shape["items"])
    if "properties" in shape:
        shape["properties"] = {key: shape_schema(value) for key, value in shape["properties"].items()}
    if schema.get("enum"):
        shape["maxLength"] = ANSWER_MAX_CHARS
    return shape


def ok_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema an ok value satisfies: the role's, except that duplicate list items were dropped."""
    if "items" in schema:
        return {**schema, "minItems": 1}
    if "properties" in schema:
        return {**schema, "properties": {key: ok_schema(value) for key, value in schema["properties"].items()}}
    return schema


# jsonschema's verdicts beside ours (jsonparse.schema_error says why ours is the one the parsers use): every
# generated object and every ok value is checked by both
ROLE_VALIDATORS = {role: jsonschema.Draft202012Validator(spec.schema) for role, spec in ROLES.items()}
OK_VALIDATORS = {role: jsonschema.Draft202012Validator(ok_schema(spec.schema)) for role, spec in ROLES.items()}


def encodable(*values: Any) -> bool:
    try:
        json.dumps(values, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, TypeError):
        return False
    return True


def role_violations(role: str, parsed: Parsed) -> list[str]:
    schema = ROLES[role].schema
    problems = []
    if not isinstance(parsed, Parsed) or not isinstance(parsed.value, dict):
        return [f"not a Parsed with a dict value: {parsed!r:.200}"]
    shape_problem = schema_error(parsed.value, shape_schema(schema))
    if shape_problem:
        problems.append(f"value shape: {shape_problem}")
    if parsed.ok:
        problem = schema_error(parsed.value, ok_schema(schema)) or content_error(parsed.value)
        if problem:
            problems.append(f"ok but {problem}")
        if not OK_VALIDATORS[role].is_valid(parsed.value):
            problems.append("ok but jsonschema finds it invalid")
        if parsed.error is not None:
            problems.append("ok with an error")
    elif not parsed.error:
        problems.append("not ok without an error")
    if role == "consolidation" and not parsed.ok and parsed.value.get("sufficient") is not False:
        problems.append("a failed consolidation says sufficient")
    return problems


def baseline_violations(name: str, parsed: Parsed) -> list[str]:
    value, problems = parsed.value, []

    def bounded_text(text: object, limit: int | None = None) -> bool:
        return isinstance(text, str) and (limit is None or len(text) <= limit) and scrub(text) == text

    def query_ok(query: object) -> bool:
        return query is None or (bounded_text(query, BASELINE_QUERY_MAX_CHARS) and has_content(query))

    if name.startswith("searcher"):
        important = value["important"]
        if set(value) != {"complete", "query", "important"} or not isinstance(value["complete"], bool):
            problems.append("searcher keys/types")
        if not query_ok(value["query"]) or (value["complete"] and value["query"] is not None):
            problems.append(f"searcher query {value['query']!r:.80}")
        if important is not None and not (
            isinstance(important, list)
            and len(important) <= MAX_IMPORTANT
            and all(type(n) is int and 0 <= n < 10**6 for n in important)
        ):
            problems.append("searcher important")
        if parsed.ok != (value["complete"] or bool(value["query"])):
            problems.append("searcher ok")
    elif name == "reasoner":
        if set(value) != {"query"} or not query_ok(value["query"]) or (not parsed.ok and value["query"] is not None):
            problems.append(f"reasoner query {value!r:.80}")
    elif name == "condensed":
        info = value["information"]
        if set(value) != {"information"} or not bounded_text(info) or not has_content(info):
            problems.append("condensed information")
    elif name == "action":
        action, subs = value["action"], value["sub_queries"]
        if action not in (None, "search", "answer") or not bounded_text(value["content"]):
            problems.append("action/content")
        if not isinstance(subs, list) or len(subs) > MAX_SUB_QUERIES or not all(query_ok(s) and s for s in subs):
            problems.append("sub-queries")
        if (action == "search") != bool(subs) or parsed.ok != (action is not None):
            problems.append("action ok")
    elif name.startswith("direct"):
        answer, how = value["answer"], value["format"]
        if not bounded_text(answer, ANSWER_MAX_CHARS) or how not in ("boxed", "answer_tag", "letter", "raw", "none"):
            problems.append("direct answer")
        if name == "direct_choice" and answer not in ["", *LETTERS]:
            problems.append("direct choice letter")
        if parsed.ok and not has_content(answer):
            problems.append("ok direct answer without content")
    return problems


def answer_pair_violations(name: str, pair: tuple[str, str]) -> list[str]:
    answer, how = pair
    problems = []
    if not isinstance(answer, str) or len(answer) > ANSWER_MAX_CHARS or scrub(answer) != answer:
        problems.append(f"answer {answer!r:.80}")
    if how not in ("boxed", "answer_tag", "answer_line", "letter", "raw", "none") or (how == "none" and answer):
        problems.append(f"how {how!r}")
    if name.endswith("choice") and answer not in ["", *LETTERS]:
        problems.append("not a letter")
    return problems


def _parsed(parse: Callable[[str], Parsed], check: Callable[[str, Parsed], list[str]], name: str):
    def violations(text: str) -> list[str]:
        parsed = parse(text)
        problems = check(name, parsed)
        if not encodable(parsed.value, parsed.error, parsed.notes):
            problems.append("value, error or notes not encodable as UTF-8 JSON")
        return problems

    return violations


# Every parser of model output: name -> text -> its contract violations (an exception propagates).
PARSERS: dict[str, Callable[[str], list[str]]] = {
    **{f"maps_{name}": _parsed(role.parse, role_violations, name) for name, role in ROLES.items()},
    "searcher": _parsed(parse_searcher, baseline_violations, "searcher"),
    "searcher_query_open": _parsed(lambda t: parse_searcher(t, query_open=True), baseline_violations, "searcher_open"),
    "reasoner": _parsed(parse_reasoner, baseline_violations, "reasoner"),
    "condensed": _parsed(parse_condensed, baseline_violations, "condensed"),
    "action": _parsed(parse_action, baseline_violations, "action"),
    "direct": _parsed(lambda t: parse_direct(t, None), baseline_violations, "direct"),
    "direct_choice": _parsed(lambda t: parse_direct(t, LETTERS), baseline_violations, "direct_choice"),
    "reasoned_answer": lambda t: answer_pair_violations("reasoned", extract_reasoned_answer(t)),
    "reasoned_answer_choice": lambda t: answer_pair_violations("choice", extract_reasoned_answer(t, LETTERS)),
    "answer_tag": lambda t: answer_pair_violations("tag", extract_answer_tag(t)),
    "answer_tag_choice": lambda t: answer_pair_violations("tag_choice", extract_answer_tag(t, LETTERS)),
    "direct_answer": lambda t: answer_pair_violations("direct", extract_direct_answer(t)),
    "query_text": lambda t: [] if query_text(t) is None or has_content(query_text(t)) else ["query without content"],
    "last_boxed": lambda t: [] if last_boxed(t) is None or isinstance(last_boxed(t), str) else ["last_boxed type"],
    "close_open_tag": lambda t: [] if close_open_tag(t).startswith(t) else ["close_open_tag lost text"],
}


# -- strategies --------------------------------------------------------------------------------------------------

TOKENS = [
    "{", "}", "[", "]", '"', "'", "\\", ":", ",", " ", "\n", "\t", "true", "false", "null", "NaN", "Infinity", "-",
    "1e999", "True", "None", "()", "<think>", "</think>", "```", "```json", "<answer>", "</answer>", "<search>",
    "</search>", "##", "\\boxed{", "\\text{", "<query>", "</query>", "<important_info>", "</important_info>",
    "<search_complete>", "</search_complete>", BEGIN_QUERY, END_QUERY, INFO_HEADING, "- ", "1. ", "(2) ", "Answer:",
    "final answer is ", '"query"', '"queries"', '"directions"', '"answer"', '"observation"', '"state"',
    '"sufficient"', "'query'", "...", "A", "(B)", "c.", "é", "北京", "\\u00e9", "\\ud800", "\\udfff", "\\n", "\u00a0",
    "7" * 60, "9" * 400, "\x00",
]  # fmt: skip
LONE_SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
fragment = st.one_of(
    st.sampled_from(TOKENS),
    st.text(max_size=12),
    LONE_SURROGATE,
    st.builds(lambda token, times: token * times, st.sampled_from(TOKENS), st.integers(2, 300)),
)
adversarial_text = st.lists(fragment, max_size=30).map("".join)

PLACEHOLDERS = ["", " ", "...", "-", ", ", "?", "<think>", "<think>x</think>", "\u2026", "\n\t"]
NON_STRINGS = [None, 0, -1, 1.5, True, False, [], {}, ["x"], {"x": "y"}, 10**30]
readable = st.characters(categories=("L", "N", "P", "Zs"), exclude_characters="<")


def good_string(max_chars: int):
    return st.text(readable, min_size=1, max_size=min(max_chars, 60)).filter(lambda s: has_content(" ".join(s.split())))


def field_value(max_chars: int):
    """A string field as small models write it: fine, too long, a placeholder, the wrong type, with a surrogate,
    or JSON-ish noise."""
    return st.one_of(
        good_string(max_chars),
        st.integers(max_chars + 1, max_chars + 40).map(lambda k: "w" * k),
        st.sampled_from(PLACEHOLDERS),
        st.sampled_from(NON_STRINGS),
        st.builds(lambda a, s: a + s, good_string(20), LONE_SURROGATE),
        adversarial_text,
    )


def list_value(max_chars: int):
    """A list field: N strings, mostly fine (one bad item is the interesting case), any list, or no list."""
    mostly_fine = st.one_of(good_string(max_chars), good_string(max_chars), field_value(max_chars))
    return st.one_of(
        st.lists(mostly_fine, min_size=N, max_size=N),
        st.lists(field_value(max_chars), max_size=N + 2),
        st.sampled_from(NON_STRINGS),
    )


def bool_value():
    return st.one_of(st.booleans(), st.sampled_from(["true", "false", "True", "yes", "no", 1, 0, None, "maybe"]))


ROLE_FIELDS = {
    "directions": {"directions": list_value(DIRECTION_MAX_CHARS)},
    "queries": {"queries": list_value(QUERY_MAX_CHARS)},
    "query": {"query": field_value(QUERY_MAX_CHARS)},
    "consolidation": {
        "observation": field_value(OBSERVATION_MAX_CHARS),
        "state": field_value(STATE_MAX_CHARS),
        "sufficient": bool_value(),
    },
    "answer": {"answer": field_value(ANSWER_MAX_CHARS)},
    "answer_choice": {"answer": st.one_of(st.sampled_from([*LETTERS, "a", "(B)", "E", "C.", "AB"]), field_value(5))},
}


def role_object(role: str):
    """The role's object with keys dropped and extra keys added now and then."""
    fields = ROLE_FIELDS[role]
    return st.builds(
        lambda values, dropped, extra: {**{k: v for k, v in values.items() if k not in dropped}, **extra},
        st.fixed_dictionaries(fields),
        st.sets(st.sampled_from(sorted(fields)), max_size=1),
        st.dictionaries(st.sampled_from(["extra", "why", "query", "answer"]), st.integers(), max_size=1),
    )


def render(obj: dict[str, Any], style: str, cut: float | None) -> tuple[str, str | None]:
    """`obj` written the ways models write it, possibly cut off (the token limit); and its JSON text (None when
    written as a Python dict)."""
    if style == "python":
        text, json_text = repr(obj), None
    else:
        text = json_text = json.dumps(obj, ensure_ascii=style == "ascii")
    if style == "fenced":
        text = f"Here it is:\n```json\n{text}\n```\nDone."
    elif style == "prose":
        text = f"Sure! {text} Hope this helps."
    elif style == "thinking":
        text = f'<think>maybe {{"query": "no"}}</think>\n{text}'
    if cut is not None:
        text = text[: int(len(text) * cut)]
    return text, json_text


def says_something(value: Any) -> bool:
    """Every string in `value` has a letter or digit once thinking and whitespace are gone, and no surrogate."""
    if isinstance(value, str):
        return scrub(value) == value and has_content(" ".join(strip_thinking(value).split()))
    if isinstance(value, list):
        return all(says_something(item) for item in value)
    if isinstance(value, dict):
        return all(says_something(item) for item in value.values())
    return True


RENDER_STYLES = st.sampled_from(["ascii", "unicode", "python", "fenced", "prose", "thinking"])
CUTS = st.one_of(st.none(), st.none(), st.floats(0, 1))


# -- properties: never raises, contract kept ---------------------------------------------------------------------


def assert_contract(name: str, text: str) -> None:
    violations = PARSERS[name](text)
    assert not violations, f"{name}: {violations} on {text!r:.300}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(PARSERS))
@budget(250)
@given(text=adversarial_text)
def test_every_parser_keeps_the_contract_on_adversarial_text(name, text):
    assert_contract(name, text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", sorted(ROLES))
@budget(300)
@given(data=st.data())
def test_role_objects_with_wrong_types_extra_keys_and_long_strings(role, data):
    """ok exactly when the text (thinking removed) holds the object as JSON, the object is valid against the
    role's schema and every string in it says something; the contract in every case."""
    obj = data.draw(role_object(role), label="object")
    style = data.draw(RENDER_STYLES, label="style")
    text, json_text = render(obj, style, data.draw(CUTS, label="cut"))
    parsed = ROLES[role].parse(text)
    assert not role_violations(role, parsed), (role_violations(role, parsed), text[:300])
    assert encodable(parsed.value, parsed.error, parsed.notes)
    held = json_text is not None and json_text in strip_thinking(text)
    valid = schema_error(obj, ROLES[role].schema) is None
    assert valid == ROLE_VALIDATORS[role].is_valid(obj), obj
    expected_ok = held and valid and says_something(obj)
    event(f"expected ok: {expected_ok}")
    assert parsed.ok == expected_ok, (parsed, text[:300])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["maps_directions", "maps_query", "maps_consolidation", "maps_answer_choice"])
@budget(100)
@given(data=st.data())
def test_long_repetitions_stay_fast(name, data):
    """Inputs of tens of kilobytes (repeated tokens, the shape of the old quadratic and exponential cases)."""
    token = data.draw(st.sampled_from(TOKENS), label="token")
    prefix = data.draw(st.sampled_from(["", '{"directions": ["', '{"query": "', '{"a":', "<think>", "- "]))
    text = prefix + token * data.draw(st.integers(1_000, 40_000), label="times")
    assert_contract(name, text)


# -- properties: ok means valid, valid means ok ------------------------------------------------------------------


def unique_strings(max_chars: int, size: int):
    return st.lists(
        good_string(max_chars), min_size=size, max_size=size, unique_by=lambda s: " ".join(s.lower().split())
    )


VALID_OBJECTS = {
    "directions": st.fixed_dictionaries({"directions": unique_strings(DIRECTION_MAX_CHARS, N)}),
    "queries": st.fixed_dictionaries({"queries": unique_strings(QUERY_MAX_CHARS, N)}),
    "query": st.fixed_dictionaries({"query": good_string(QUERY_MAX_CHARS)}),
    "consolidation": st.fixed_dictionaries(
        {
            "observation": good_string(OBSERVATION_MAX_CHARS),
            "state": good_string(STATE_MAX_CHARS),
            "sufficient": st.booleans(),
        }
    ),
    "answer": st.fixed_dictionaries({"answer": good_string(ANSWER_MAX_CHARS)}),
    "answer_choice": st.fixed_dictionaries({"answer": st.sampled_from(LETTERS)}),
}


def normalised(value: Any) -> Any:
    """What a parser returns for a valid value: whitespace runs collapsed, ends stripped."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [normalised(item) for item in value]
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items()}
    return value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", sorted(ROLES))
@budget(200)
@given(data=st.data())
def test_valid_objects_round_trip_ok(role, data):
    obj = data.draw(VALID_OBJECTS[role], label="object")
    assert schema_error(obj, ROLES[role].schema) is None and ROLE_VALIDATORS[role].is_valid(obj)
    style = data.draw(st.sampled_from(["ascii", "unicode", "fenced", "prose", "thinking"]), label="style")
    parsed = ROLES[role].parse(render(obj, style, None)[0])
    assert parsed.ok, parsed.error
    assert parsed.value == normalised(obj)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", sorted(ROLES))
@budget(150)
@given(data=st.data())
def test_python_style_dicts_are_used_but_never_ok(role, data):
    obj = data.draw(VALID_OBJECTS[role], label="object")
    parsed = ROLES[role].parse(repr(obj))
    assert not parsed.ok and not role_violations(role, parsed)


@pytest.mark.timeout(120)
@budget(300)
@given(data=st.data())
def test_schema_check_agrees_with_jsonschema(data):
    role = data.draw(st.sampled_from(sorted(ROLES)), label="role")
    obj = data.draw(role_object(role), label="object")
    assert (schema_error(obj, ROLES[role].schema) is None) == ROLE_VALIDATORS[role].is_valid(obj)


# -- baselines: round trips --------------------------------------------------------------------------------------

plain = st.text(st.characters(categories=("L", "N", "Zs")), min_size=1, max_size=40).filter(has_content)


@pytest.mark.timeout(120)
@budget(200)
@given(queries=st.lists(plain, min_size=1, max_size=4), before=plain, answer=plain)
def test_baseline_formats_round_trip(queries, before, answer):
    search = parse_action(f"{before} <search> {' ## '.join(queries)} </search>")
    assert search.ok and search.value["sub_queries"] == [q.strip() for q in queries]
    assert parse_action(f"<think>{before}</think><answer>{answer}</answer>").value["content"] == answer.strip()
    assert parse_reasoner(f"{before} {BEGIN_QUERY}{queries[0]}").value["query"] == queries[0].strip()
    assert parse_searcher(f"<query>{json.dumps({'query': queries[0]})}</query>").value["query"] == queries[0].strip()
    assert parse_condensed(f"{before}\n{INFO_HEADING}\n{answer}").value["information"] == " ".join(answer.split())
    expected = " ".join(answer.split())
    assert extract_reasoned_answer(f"{before} \\boxed{{{answer}}}") == (expected, "boxed")
    assert extract_answer_tag(f"{before}<answer>{answer}</answer>") == (expected, "answer_tag")
    assert parse_direct(f"<think>{before}</think>{answer}", None).value == {"answer": expected, "format": "raw"}


# -- the linear helpers do what the regexes they replace did -----------------------------------------------------

small_text = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=4)), max_size=12).map("".join)
OLD_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
OLD_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
OLD_OPEN_TAG = re.compile(r"<(search|answer)>(?!.*</\1>)", re.DOTALL)


def old_strip_thinking(text: str) -> str:
    text = OLD_THINK.sub("", text)
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()


def old_last_boxed(text: str) -> str | None:
    position = text.rfind("\\boxed{")
    while position >= 0:
        depth, start = 1, position + len("\\boxed{")
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                inner = text[start:i].strip()
                match = re.match(r"^\\text\{(.*)\}$", inner, re.DOTALL)
                return (match.group(1).strip() if match else inner).strip("()").strip()
        position = text.rfind("\\boxed{", 0, position)
    return None


def old_close_open_tag(piece: str) -> str:
    opened = list(OLD_OPEN_TAG.finditer(piece))
    return piece + f"</{opened[-1].group(1)}>" if opened else piece


@pytest.mark.timeout(120)
@budget(400)
@given(text=small_text)
def test_linear_helpers_match_the_regexes_they_replace(text):
    assert strip_thinking(text) == old_strip_thinking(text)
    for opener, closer in (("<answer>", "</answer>"), ("<query>", "</query>")):
        pattern = re.escape(opener) + "(.*?)" + re.escape(closer)
        assert tag_contents(text, opener, closer) == re.findall(pattern, text, re.DOTALL)
    old = OLD_ACTION.search(text)
    assert first_action(text) == (old.group(1, 2) if old else None)
    assert close_open_tag(text) == old_close_open_tag(text)
    assert last_boxed(text) == old_last_boxed(text)


@pytest.mark.timeout(120)
@budget(200)
@given(text=adversarial_text)
def test_json_helpers_never_raise(text):
    found = find_json_object(text)
    assert found is None or isinstance(found, dict)
    assert all(isinstance(item, str) and item for item in list_items(text))
