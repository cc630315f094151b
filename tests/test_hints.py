"""Privileged hints for teacher traces (traces.hint: gold_titles, STaR's rationalization): the writer of a traced run
sees the titles of the gold passages its prompt names and no search found; the SFT rows train on the prompt
without them; evaluation and RL refuse the hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after, user_text

from maps_train.agents.runner import build_engine, run_method
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.evidence import GoldPassage
from maps_train.records.hints import gold_title_hint, student_messages
from maps_train.records.trace import iter_traces
from maps_train.retrieval.base import Hit
from maps_train.traces.collect import sample_recipe

EIFFEL = GoldPassage("p1", "Gustave Eiffel", "Gustave Eiffel was born in Dijon.")
DIJON = GoldPassage("p2", "Dijon", "Dijon is the capital of Burgundy.")
HINT = 'Hint: the passages this question needs include the Wikipedia article "Gustave Eiffel".'


def test_the_hint_names_only_titles_the_prompt_shows_and_no_search_found():
    prompt = "Question:\nWhere was the engineer Gustave Eiffel born?\n\nRetrieval direction:\nhis birthplace"
    assert gold_title_hint([EIFFEL, DIJON], prompt, [], {}) == HINT  # Dijon is not in the prompt: never guessed
    assert gold_title_hint([EIFFEL, DIJON], prompt, ["p7", "p1"], {}) is None  # already found by id
    both = gold_title_hint([EIFFEL, DIJON], prompt + "\nKnowledge: he was born in Dijon.", [], {})
    assert both == 'Hint: the passages this question needs include the Wikipedia articles "Gustave Eiffel"; "Dijon".'
    # Whole words after FlashRAG's normalisation: "The Island" is "island", which "Islanders" does not hold.
    island = GoldPassage(None, "The Island", "The Island is a reality show.")
    assert gold_title_hint([island], "Who hosts the island, the show?", [], {}) is not None
    assert gold_title_hint([island], "Who are the Islanders?", [], {}) is None
    # A gold passage known by title and text is found by its text among the passages searched.
    searched = {"c9": Hit("c9", "Gustave Eiffel", "Gustave Eiffel was born in Dijon. He built towers.", 1.0)}
    by_text = GoldPassage(None, "Gustave Eiffel", "Gustave Eiffel was born in Dijon.")
    assert gold_title_hint([by_text], prompt, ["c9"], searched) is None


def world(tmp_path, hint: str):
    recipe = load_recipe(None, ["agent.num_directions=2", "agent.max_rounds=2", "agent.top_k=1", f"traces.hint={hint}",
                                f"traces.out_dir={tmp_path / 'traces'}"])
    question = Question(id="q1", question="Where was Gustave Eiffel born?", golden_answers=["Dijon"],
                        metadata={"supporting_paragraphs": [
                            {"title": d.title, "text": d.text, "corpus_id": d.corpus_id} for d in (EIFFEL, DIJON)]})
    # Lyon first: a query that shares no word with any passage (a tie) retrieves it.
    passages = [Hit("p3", "Lyon", "Lyon is on the Rhone.", 0.0)]
    passages += [Hit(d.corpus_id, d.title, d.text, 0.0) for d in (EIFFEL, DIJON)]

    def writer(request, turn):  # a teacher that takes the hint when it has one
        return json.dumps({"query": "Gustave Eiffel" if "Hint:" in user_text(request) else "where lookup"})

    backend = ScriptedBackend({"writer": writer, "consolidator": consolidator_sufficient_after(None)})
    return sample_recipe(recipe, 0), question, backend, RecordingRetriever(passages)


def test_a_hinted_teacher_run_records_its_hint_and_its_rows_train_without_it(tmp_path):
    from maps_train.traces.sft import build_sft_sets

    hinted, question, backend, retriever = world(tmp_path / "hinted", "gold_titles")
    assert hinted.agent.hint == "gold_titles"
    run_method(hinted, [question], tmp_path / "hinted", backend=backend, retriever=retriever, progress=False)
    writers = backend.requests("writer")
    # Round 1: both writers see the hint (Gustave Eiffel is named and not yet found); Dijon is never hinted.
    # Round 2: p1 was found in round 1, so no hint is left.
    assert [HINT in user_text(r) for r in writers] == [True, True, False, False]
    assert not any("Hint:" in user_text(r) for r in backend.requests() if r.role != "writer")
    [(_, trace)] = list(iter_traces(tmp_path / "hinted" / "traces.jsonl"))
    calls = [c for c in trace.all_calls() if c.role == "writer"]
    assert [c.hint for c in calls] == [HINT, HINT, None, None]
    assert trace.credit["found"] == 1

    plain, _, plain_backend, plain_retriever = world(tmp_path / "plain", "none")
    run_method(plain, [question], tmp_path / "plain", backend=plain_backend, retriever=plain_retriever, progress=False)
    [(_, unhinted)] = list(iter_traces(tmp_path / "plain" / "traces.jsonl"))
    first_plain = next(c for c in unhinted.all_calls() if c.role == "writer")
    # The student's prompt is exactly the prompt an unhinted run sends; the hinted one's completion is the row's.
    assert student_messages(calls[0]) == first_plain.messages != calls[0].messages
    assert build_engine(hinted, backend, retriever).config_digest != build_engine(plain, backend, retriever).config_digest

    recipe = load_recipe(None, ["sft_data.filter=role", "sft_data.tokenizer=null", "train.student=builtin:tiny-qwen3",
                                "sft_data.min_rows_per_role=1", f"sft_data.out_dir={tmp_path / 'sft'}"])
    stats = build_sft_sets(recipe, traces_dir=str(tmp_path / "hinted" / "traces.jsonl"))
    assert stats.rows["writer"]["kept"] == 1  # the first hinted writer found p1 new; the second re-found it
    [row] = [json.loads(line) for line in (tmp_path / "sft" / "writer" / "train.jsonl").read_text().splitlines()]
    assert row["prompt"] == first_plain.messages and "Hint:" not in json.dumps(row)
    assert json.loads(row["completion"][0]["content"]) == {"query": "Gustave Eiffel"}

    calls[0].messages[-1]["content"] = first_plain.messages[-1]["content"]  # a trace edited after it was written
    with pytest.raises(MapsTrainError, match=r"^call: the writer call's hint is not in its last message"):
        student_messages(calls[0])


def test_evaluation_and_rl_refuse_the_hint(tmp_path):
    from maps_train.evaluate.suite import SystemSpec, load_system_recipe
    from maps_train.rl.checks import check_rl_config

    demo = Path(__file__).resolve().parents[1] / "recipes" / "demo" / "demo.yaml"
    spec = SystemSpec(name="hinted", recipe=str(demo), overrides=["agent.hint=gold_titles"])
    with pytest.raises(ConfigError, match=r"systems\[0\] \(hinted\): agent.hint: 'gold_titles' shows the agent the "
                                          r"gold passages' titles, for teacher traces only"):
        load_system_recipe(spec, 0, tmp_path / "suite.yaml")
    with pytest.raises(ConfigError, match=r"^agent.hint: 'gold_titles' .* RL episodes must run as deployed"):
        check_rl_config(load_recipe(None, ["agent.hint=gold_titles", f"rl.output_dir={tmp_path}"]))
