"""Role-output parsing (tolerant, with fallbacks), prompt files, evidence formatting."""

from __future__ import annotations

import pytest

from maps_train.agents.jsonparse import find_json_object, strip_thinking
from maps_train.agents.outputs import (
    directions_schema,
    parse_answer,
    parse_consolidation,
    parse_directions,
    parse_query,
)
from maps_train.agents.prompt_context import format_passages, merge_hits, passage_body
from maps_train.agents.prompting import PACKAGED_PROMPTS, PromptLibrary
from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Hit


@pytest.mark.parametrize(
    "text",
    [
        '{"query": "x"}',
        '```json\n{"query": "x"}\n```',
        'Sure! {"query": "x"} Hope this helps. {"other": 1}',
        "{'query': 'x'}",
        '<think>let me think {"query": "wrong"}</think>{"query": "x"}',
        'noise { not json } then {"query": "x"}',
    ],
)
def test_json_object_is_found_in_messy_text(text):
    assert find_json_object(text) == {"query": "x"}


def test_unparseable_text_gives_none():
    assert find_json_object("no braces here") is None
    assert find_json_object('{"query": "cut off') is None
    assert strip_thinking("<think>unfinished") == ""


def test_directions_exact_count_is_ok_and_anything_else_is_a_counted_failure():
    ok = parse_directions('{"directions": ["a", "b", "c"]}', 3, "Q?")
    assert ok.ok and ok.value == {"directions": ["a", "b", "c"]}
    extra = parse_directions('{"directions": ["a", "b", "c", "d"]}', 3, "Q?")
    assert not extra.ok and extra.value["directions"] == ["a", "b", "c"]
    short = parse_directions('{"directions": ["a"]}', 3, "Q?")
    assert not short.ok and short.value["directions"] == ["a"]
    cut = parse_directions('{"directions": ["first one", "second', 3, "Q?")
    assert not cut.ok and cut.value["directions"] == ["first one"]
    prose = parse_directions("Directions:\n1. Find the author\n2. Find the birthplace", 3, "Q?")
    assert not prose.ok and prose.value["directions"] == ["Find the author", "Find the birthplace"]
    nothing = parse_directions("", 3, "Q?")
    assert not nothing.ok and nothing.value["directions"] == ["Q?"] and "fallback" in nothing.error
    # Placeholders copied from the prompt's reply form are not directions (seen from a 135M teacher).
    copied = parse_directions('{"directions": ["...", "Find the river"]}', 2, "Q?")
    assert not copied.ok and copied.value["directions"] == ["Find the river"]
    only_dots = parse_directions('{"directions": ["...", ", "]}', 2, "Q?")
    assert not only_dots.ok and only_dots.value["directions"] == ["Q?"]
    assert parse_directions('{"directions": ["Qui a écrit ?", "Où ?"]}', 2, "Q?").ok  # letters of any script


def test_query_fallbacks():
    assert parse_query('{"query": "  birthplace of  Eiffel "}', "d").value == {"query": "birthplace of Eiffel"}
    recovered = parse_query('{"query": "birthplace of Eiff', "d")
    assert not recovered.ok and recovered.value["query"] == "birthplace of Eiff"
    fallback = parse_query("???", "the direction")
    assert not fallback.ok and fallback.value["query"] == "the direction"
    placeholder = parse_query('{"query": "..."}', "the direction")
    assert not placeholder.ok and placeholder.value["query"] == "the direction"


def test_consolidation_parsing():
    good = parse_consolidation('{"observation": "o", "state": "s", "sufficient": true}', "old", "ev")
    assert good.ok and good.value == {"observation": "o", "state": "s", "sufficient": True}
    # A string boolean is a counted repair, and a parse that is not ok never ends the search.
    stringy = parse_consolidation('{"observation": "o", "state": "s", "sufficient": "true"}', "old", "ev")
    assert not stringy.ok and stringy.value == {"observation": "o", "state": "s", "sufficient": False}
    assert "said true" in stringy.notes[0]
    missing_state = parse_consolidation('{"observation": "o", "sufficient": true}', "old", "ev")
    assert not missing_state.ok and missing_state.value["state"] == "old"
    garbage = parse_consolidation("{{{{", "old", "first sentences")
    assert garbage.value == {"observation": "first sentences", "state": "old", "sufficient": False}
    dots = parse_consolidation('{"observation": "...", "state": ", ", "sufficient": true}', "old", "ev")
    assert not dots.ok and dots.value == {"observation": "ev", "state": "old", "sufficient": False}


def test_answer_parsing_short_and_choice():
    assert parse_answer('{"answer": "Dijon"}').value == {"answer": "Dijon"}
    number = parse_answer('{"answer": 1889}')  # written out, but the schema asks for a string
    assert number.value == {"answer": "1889"} and not number.ok
    raw = parse_answer("Dijon, France")
    assert not raw.ok and raw.value["answer"] == "Dijon, France"
    letters = ["A", "B", "C", "D"]
    assert parse_answer('{"answer": "C"}', letters).ok
    decorated = parse_answer('{"answer": "(C)"}', letters)
    assert decorated.value["answer"] == "C" and not decorated.ok
    assert parse_answer("I pick D because...", letters).value["answer"] == "D"


def test_schema_bounds_every_string_and_array():
    schema = directions_schema(4)["properties"]["directions"]
    assert schema["minItems"] == schema["maxItems"] == 4 and schema["items"]["maxLength"] > 0


def test_every_packaged_prompt_has_a_header_and_renders(tmp_path):
    library = PromptLibrary()
    files = sorted(PACKAGED_PROMPTS.glob("maps/*.txt"))
    assert len(files) == 12
    for path in files:
        assert path.read_text().startswith("# ")
        template = library.get(f"maps/{path.stem}")
        messages = template.render(**{slot: f"<{slot}>" for slot in template.slots})
        text = "\n".join(m["content"] for m in messages)
        assert not any(line.startswith("#") for line in text.splitlines())
        assert {"question", "observations", "state"} <= template.slots
        assert ("trajectory" in template.slots) == path.stem.endswith("_coupled")


def test_slot_values_are_not_reinterpreted_and_prompts_dir_overrides(tmp_path):
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "writer.txt").write_text("# my header\n[user]\nQ={{question}} D={{direction}}\n")
    library = PromptLibrary(tmp_path)
    messages = library.render("maps/writer", question="{{direction}} {x}", direction="d")
    assert messages == [{"role": "user", "content": "Q={{direction}} {x} D=d"}]
    assert library.get("maps/proposer").path.parent == PACKAGED_PROMPTS / "maps"
    with pytest.raises(MapsTrainError, match="no value for slot"):
        library.render("maps/writer", question="q")
    with pytest.raises(MapsTrainError, match="agent.prompts_dir"):
        PromptLibrary(tmp_path / "absent")


def test_merge_interleaves_by_rank_and_dedupes():
    a = [Hit("1", "", "", 1), Hit("2", "", "", 1), Hit("3", "", "", 1)]
    b = [Hit("2", "", "", 1), Hit("4", "", "", 1), Hit("1", "", "", 1)]
    assert [h.id for h in merge_hits([a, b])] == ["1", "2", "4", "3"]
    assert merge_hits([]) == []


def test_passages_are_formatted_without_a_repeated_title_line():
    hit = Hit("7", "Dijon", "Dijon\nDijon is a city in France.", 1.0)
    assert passage_body(hit) == "Dijon is a city in France."
    assert format_passages([hit], max_words=3) == "[1] Dijon: Dijon is a ..."
