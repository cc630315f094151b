"""Fixed cases of issue 15 (role parsers that never crash or hang): every reported reproducer, the string-boolean
rule through the MAPS engine, and the fuzz corpus (tests/fuzz_corpus/, one file per input that once broke a
parser) run through every parser.

Speed is never a timed assertion: inputs that took seconds to hours before (exponential or quadratic) run under a
per-test timeout, which turns a hang into a failure, and the bounded work is checked by counting calls.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend
from test_parse_properties import LETTERS, PARSERS

from maps_train.agents import jsonparse
from maps_train.agents.baselines.answers import (
    extract_answer_tag,
    extract_direct_answer,
    extract_reasoned_answer,
    last_boxed,
)
from maps_train.agents.baselines.parallel_search import close_open_tag, parse_action
from maps_train.agents.baselines.s3 import parse_searcher, query_text
from maps_train.agents.baselines.search_o1 import parse_reasoner
from maps_train.agents.baselines.vanilla import parse_direct
from maps_train.agents.jsonparse import (
    MAX_INPUT_CHARS,
    MAX_JSON_STARTS,
    MAX_SCAN_CHARS,
    UnsupportedSchemaError,
    extract_string_list,
    list_items,
    schema_error,
    strip_thinking,
)
from maps_train.agents.maps import MapsEngine
from maps_train.agents.outputs import (
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
from maps_train.questions import Question
from maps_train.recipe import load_recipe

CORPUS = Path(__file__).parent / "fuzz_corpus"


def corpus_text(path: Path) -> str:
    return "".join(text * times for text, times in json.loads(path.read_text())["parts"])


# -- crashes -------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_boolean_choice_answer_is_a_counted_failure_not_a_type_error():
    parsed = parse_answer('{"answer":true}', ["A", "B", "C", "D"])
    assert not parsed.ok and "expected string" in parsed.error


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        '{"a":' + "[" * 1000,  # RecursionError in json
        '{"a":' + "1" * 4301,  # ValueError: int digit limit
        "{[]:''}",  # TypeError from ast.literal_eval (a list as a key)
        "{'a': " + "-" * 7900 + "1}",  # the literal tier's parser on a long unary chain
    ],
)
def test_json_and_literal_tiers_never_raise(text):
    parsed = parse_query(text, "the direction")
    assert not parsed.ok and parsed.value == {"query": "the direction"}


@pytest.mark.timeout(10)
def test_s3_searcher_survives_huge_digit_runs_and_deep_json():
    huge = parse_searcher("<important_info>[2, " + "1" * 5000 + "]</important_info><query>who</query>")
    assert huge.ok and huge.value == {"complete": False, "query": "who", "important": [2]}
    assert query_text('{"query": ' + "1" * 5000 + "}") is not None  # not JSON within bounds: the raw text
    deep = parse_searcher("<query>who " + "[" * 60_000 + "</query>")  # not JSON: the raw text, cut
    assert deep.ok and deep.value["query"] == "who " + "[" * 996
    assert parse_searcher("<query>" + "[" * 100_000 + "</query>").value["query"] is None  # no letter or digit


# -- hangs: were exponential or quadratic; the timeout is the check -------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("backslashes", [36, 44, 1000, MAX_INPUT_CHARS])
def test_backslashes_in_a_cut_off_list_are_linear(backslashes):
    """Before: 4.5 s at 36 backslashes, 174 s at 44, doubling with every two more (catastrophic backtracking)."""
    parsed = parse_directions('{"directions": ["' + "\\" * backslashes, 3, "q")
    assert not parsed.ok and parsed.value == {"directions": ["q"]}


@pytest.mark.timeout(20)
def test_quadratic_inputs_finish():
    assert parse_query("{" * 8000, "d").value == {"query": "d"}
    assert parse_query("<think>" * (MAX_INPUT_CHARS // 7), "d").value == {"query": "d"}
    assert last_boxed("\\boxed{" * (MAX_INPUT_CHARS // 7)) is None
    assert extract_answer_tag("<answer>" * (MAX_INPUT_CHARS // 8)) == ("", "none")
    assert extract_reasoned_answer("answer" + " " * 60_000 + "x") == ("", "none")
    searches = parse_action("<search>" * (256 * 1024 // 8))
    assert searches.ok and searches.notes == [f"input of {256 * 1024} characters cut to {MAX_INPUT_CHARS}"]
    assert close_open_tag("<search>" * 32_768).endswith("</search>")
    assert list_items("- a" + " " * 60_000 + "b") == ["a" + " " * 60_000 + "b"]
    assert strip_thinking("```" * 20_000 + "<think>") == "```" * 20_000


@pytest.mark.timeout(10)
def test_json_starts_are_bounded(monkeypatch):
    """Linear time without a clock: however many braces, at most MAX_JSON_STARTS decodes and literal scans."""
    calls = {"decode": 0, "literal": 0}
    decode, literal = jsonparse.safejson.raw_decode, jsonparse._python_literal_at

    def counted_decode(*args, **kwargs):
        calls["decode"] += 1
        return decode(*args, **kwargs)

    def counted_literal(*args, **kwargs):
        calls["literal"] += 1
        return literal(*args, **kwargs)

    monkeypatch.setattr(jsonparse.safejson, "raw_decode", counted_decode)
    monkeypatch.setattr(jsonparse, "_python_literal_at", counted_literal)
    parse_query("```json\n{'a': [" * 500 + "{'a': [" * 5000, "d")
    assert 0 < calls["decode"] <= MAX_JSON_STARTS and 0 < calls["literal"] <= MAX_JSON_STARTS


# -- costly inputs: bounded memory and work (issue 36) -------------------------------------------------------------


@pytest.mark.timeout(10)
def test_nested_boxes_are_read_without_copying_each_span():
    """Before: a 278 MB peak for 64 KB of text, every nested box's content copied. Now only the answer is copied."""
    text = "\\boxed{" * 8192 + "x" + "}" * 8191  # exactly MAX_INPUT_CHARS: every box but the outermost closes
    assert len(text) == MAX_INPUT_CHARS
    tracemalloc.start()
    try:
        answer = extract_direct_answer(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answer == ("x", "boxed")
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes for a {len(text)}-character input"


class CountingPattern:
    """A compiled pattern that counts the characters its `finditer` advanced over (up to the last match taken),
    whoever calls it: the work of a scan, measured outside the scanner."""

    def __init__(self, pattern):
        self.pattern, self.chars = pattern, 0

    def finditer(self, text, pos=0, endpos=None):
        for match in self.pattern.finditer(text, pos, len(text) if endpos is None else endpos):
            self.chars += match.end() - pos
            pos = match.end()
            yield match


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        '{"' * 32 + "[]" * 32734,  # each start's string runs to the end, or its shallow brackets do: 0.49 s before
        "{" * 15 + "[]" * 32000,  # 15 starts, none closing, none deeper than the limit
        "{'" * 32 + "x" * 65000,  # Python-literal scans, 8 KB each
    ],
    ids=["brackets-after-open-strings", "shallow-open-braces", "open-quotes"],
)
def test_json_start_scans_share_one_character_budget(monkeypatch, text):
    """Before, every one of the 32 starts could read to the end of the text (32 x 64 KB). Now the nesting scans
    and the literal brace scans of all starts together read at most MAX_SCAN_CHARS characters."""
    tokens = CountingPattern(jsonparse._JSON_TOKEN)
    literal_chars, braced_chunk = [0], jsonparse._braced_chunk

    def counted_braced_chunk(chunk_text, start, max_chars):
        chunk = braced_chunk(chunk_text, start, max_chars)
        literal_chars[0] += len(chunk) if chunk else min(len(chunk_text) - start, max_chars)
        return chunk

    monkeypatch.setattr(jsonparse, "_JSON_TOKEN", tokens)
    monkeypatch.setattr(jsonparse, "_braced_chunk", counted_braced_chunk)
    assert jsonparse.find_object(text) is None
    read = tokens.chars + literal_chars[0]
    assert 0 < read <= MAX_SCAN_CHARS <= 2 * MAX_INPUT_CHARS, f"{read} characters read"


# -- contract violations --------------------------------------------------------------------------------------------


def test_a_query_that_is_only_thinking_takes_the_direction():
    parsed = parse_query('{"query": "<think>"}', "the direction")
    assert not parsed.ok and parsed.value == {"query": "the direction"}


@pytest.mark.parametrize("text", ['{"answer": "..."}', '{"answer": "-"}', '{"answer": 0}', '{"answer": NaN}'])
def test_placeholders_and_non_strings_are_not_ok_answers(text):
    assert not parse_answer(text).ok


def test_placeholder_answers_of_the_baselines_are_not_ok():
    assert not parse_direct("-", None).ok and not parse_direct("\\boxed{...}", None).ok
    assert parse_direct("\\boxed{Dijon}", None).ok


def test_extra_keys_and_over_long_strings_are_repairs_not_ok():
    extra = parse_query('{"query": "x", "extra": 1}', "d")
    assert not extra.ok and extra.value == {"query": "x"} and "unexpected key 'extra'" in extra.error
    long = parse_query('{"query": "' + "x" * 201 + '"}', "d")
    assert not long.ok and long.value == {"query": "x" * 200} and "maxLength 200" in long.error
    assert parse_query('{"query": "' + "x" * 200 + '"}', "d").ok
    too_many = parse_directions('{"directions": ["a", "b", "c", "d"]}', 3, "q")
    assert not too_many.ok and too_many.value == {"directions": ["a", "b", "c"]}


@pytest.mark.parametrize("text", ['{"query": "\\ud800abc"}', '{"query": "\ud800abc"}'])
def test_lone_surrogates_never_reach_a_value(text):
    parsed = parse_query(text, "d")
    assert not parsed.ok and parsed.value == {"query": "\ufffdabc"}
    json.dumps(parsed.value, ensure_ascii=False).encode("utf-8")


def test_s3_never_searches_a_null_query():
    for raw in ('{"query": null}', '{"query": 5}', '{"query": "..."}', '{"query": []}'):
        parsed = parse_searcher(f"<query>{raw}</query>")
        assert not parsed.ok and parsed.value["query"] is None, raw
    assert parse_reasoner("<|begin_search_query|> ... ").value == {"query": None}


def test_a_python_style_dict_is_used_but_not_ok():
    parsed = parse_query("{'query': 'x'}", "d")
    assert not parsed.ok and parsed.value == {"query": "x"} and "Python-style" in parsed.error


def test_a_valid_list_with_duplicates_is_ok_without_them():
    parsed = parse_directions('{"directions": ["Find A", "find  a", "Find B"]}', 3, "q")
    assert parsed.ok and parsed.value == {"directions": ["Find A", "Find B"]}
    assert parsed.notes == ["duplicate items dropped"]


def test_string_lists_recover_cut_off_json_with_escapes_and_brackets():
    assert extract_string_list('{"queries": ["a \\"b\\"", "c]d", "cut', "queries") == ['a "b"', "c]d"]
    parsed = parse_queries('{"queries": ["first", "sec\\\\ond", "thi', 3, "q")
    assert not parsed.ok and parsed.value == {"queries": ["first", "sec\\ond"]}


# -- the string-boolean rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"observation": "o", "state": "s", "sufficient": "true"}',  # a string: a counted repair
        '{"observation": "o", "state": "s", "sufficient": true',  # cut off after the flag
        '{"observation": "o", "state": "s", "sufficient": true, "note": "x"}',  # an extra key
        "{'observation': 'o', 'state': 's', 'sufficient': True}",  # a Python dict
        '{"observation": "' + "o" * 801 + '", "state": "s", "sufficient": true}',  # over maxLength
    ],
)
def test_a_failed_consolidation_never_says_sufficient(text):
    parsed = parse_consolidation(text, "old", "ev")
    assert not parsed.ok and parsed.value["sufficient"] is False
    assert parsed.value["state"] == "s" and parsed.value["observation"].startswith("o")
    assert any("said true" in note for note in parsed.notes)


def test_a_string_false_is_read_and_a_clean_true_still_stops():
    assert parse_consolidation('{"observation": "o", "state": "s", "sufficient": "false"}', "", "").notes == []
    clean = parse_consolidation('{"observation": "o", "state": "s", "sufficient": true}', "", "")
    assert clean.ok and clean.value["sufficient"] is True


def test_the_engine_stops_only_on_a_clean_sufficient():
    """A consolidator that always says "sufficient": "true" (a string) runs to the round limit."""
    stringy = json.dumps({"observation": "fact", "state": "known", "sufficient": "true"})
    recipe = load_recipe(None, ["agent.max_rounds=3", "agent.num_directions=2", "agent.top_k=2"])
    engine = MapsEngine(recipe, ScriptedBackend({"consolidator": lambda r, t: stringy}), RecordingRetriever())
    (trace,) = engine.run_batch([Question(id="q0", question="Where was the engineer born?", dataset="toy")])
    assert trace.stop_reason == "max_rounds" and [r.sufficient for r in trace.rounds] == [False] * 3
    assert trace.parse_failures == {"consolidator": 3}


# -- schemas: one source of truth ------------------------------------------------------------------------------------


def test_the_validator_covers_every_role_schema_and_refuses_unknown_keywords():
    for schema in (directions_schema(3), queries_schema(2), query_schema(), consolidation_schema(), answer_schema()):
        assert schema_error({}, schema) is not None  # every role object has required keys
    assert schema_error({"answer": "B"}, answer_schema(LETTERS)) is None
    assert "not one of" in schema_error({"answer": "E"}, answer_schema(LETTERS))
    with pytest.raises(UnsupportedSchemaError):
        schema_error("x", {"type": "string", "pattern": "^x$"})


# -- the fuzz corpus -------------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.json")), ids=lambda path: path.stem)
def test_every_parser_keeps_the_contract_on_the_corpus(path):
    text = corpus_text(path)
    for name, violations in PARSERS.items():
        assert not violations(text), f"{name} on {path.name}: {violations(text)}"


def test_the_corpus_holds_every_reproducer_of_issue_15():
    names = {path.stem for path in CORPUS.glob("*.json")}
    assert len(names) >= 30 and {"crash", "hang", "contract"} == {name.split("-", 1)[0] for name in names}
