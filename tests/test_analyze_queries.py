"""`maps-train analyze queries`, counted by hand on hand-built traces whose credit the real `compute_credit` writes:
searches, directions, question echoes and evidence recall per run, and the gold found only by the run or only by
a reference run (Vanilla RAG: the question is its one query)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from maps_train.analysis.queries import against_summary, queries_markdown, read_searches, run_summary
from maps_train.cli import app
from maps_train.errors import MapsTrainError
from maps_train.records.credit import compute_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import RoundRecord, SubQueryHits, TraceRecord

GOLD = gold_evidence({"supporting_paragraphs": [
    {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon.", "corpus_id": "p4"},
    {"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "p5"},
]})
QUESTION = "Where was Eiffel born?"


def trace(question_id: str, rounds: list[tuple[list[str], dict[str, list[str]]]], method: str = "maps",
          credited: bool = True) -> TraceRecord:
    """A trace whose rounds are (directions, {query: hit ids}); its credit computed against GOLD."""
    records = [RoundRecord(index=i, directions=directions, sub_queries=list(hits),
                           retrieved=[SubQueryHits(q, ids) for q, ids in hits.items()])
               for i, (directions, hits) in enumerate(rounds, start=1)]
    record = TraceRecord(question_id=question_id, question=QUESTION, dataset="toy", method=method,
                         config_digest="d", rounds=records, stop_reason="sufficient", final_call=None,
                         final_answer="Dijon", golden_answers=["Dijon"])
    record.credit = compute_credit(record, GOLD) if credited else None
    return record


def write(path, traces: list[TraceRecord]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in traces))
    return path


@pytest.fixture()
def runs(tmp_path):
    # q1 echoes the question ("where was eiffel born" after normalisation) and finds p4; its other query finds
    # nothing. q2 searches one direction twice over two rounds and finds p5 only. q3 finds nothing (3 directions).
    # An old trace without credit is counted apart.
    maps = [
        trace("q1", [(["Eiffel", "birth"], {"where was Eiffel born": ["p4", "p1"], "birth": ["p2"]})]),
        trace("q2", [(["Dijon"], {"Dijon": ["p5"]}), (["Dijon region"], {"Dijon region": ["p3"]})]),
        trace("q3", [(["a", "b", "c"], {"a": ["p1"], "b": ["p2"], "c": ["p3"]})]),
        trace("q0", [(["x"], {"x": ["p4"]})], credited=False),
    ]
    # Vanilla RAG: the question itself, once; it finds p4 for q1, p4 and p5 for q2, p4 for q3.
    vanilla = [trace(q, [([], {QUESTION: ids})], method="vanilla")
               for q, ids in (("q1", ["p4"]), ("q2", ["p4", "p5"]), ("q3", ["p4"]))]
    return write(tmp_path / "maps" / "toy" / "traces.jsonl", maps), write(tmp_path / "vanilla.jsonl", vanilla)


def test_run_figures_counted_by_hand(runs):
    maps_path, vanilla_path = runs
    searches, uncredited = read_searches(maps_path.parent.parent)  # the system's folder: every traces.jsonl under it
    assert uncredited == 1 and sorted(k[1] for k in searches) == ["q1", "q2", "q3"]
    summary = run_summary(searches, uncredited)
    assert summary["questions"] == 3
    assert summary["searches_per_question"] == pytest.approx(7 / 3)
    assert summary["directions_per_round"] == pytest.approx((2 + 1 + 1 + 3) / 4)
    assert summary["words_per_query"] == pytest.approx((4 + 1 + 1 + 2 + 1 + 1 + 1) / 7)
    assert summary["echo_share"] == pytest.approx(1 / 3)
    # Recall: q1 1/2, q2 1/2, q3 0.
    assert summary["recall"] == pytest.approx(1 / 3)
    assert (summary["recall_echo"], summary["recall_no_echo"]) == (pytest.approx(0.5), pytest.approx(0.25))
    vanilla = run_summary(read_searches(vanilla_path)[0])
    assert vanilla["echo_share"] == 1.0 and vanilla["directions_per_round"] is None
    assert vanilla["recall"] == pytest.approx((1 / 2 + 1 + 1 / 2) / 3)


def test_the_question_search_of_search_question_is_no_echo_and_no_sub_query(tmp_path):
    from maps_train.records.trace import QUESTION_SEARCHED

    # agent.search_question: round 1 searched the question first (p4), then the written sub-queries. In q1 the
    # writer's queries are "Dijon" (p5) and "birth" (p2); in q2 one of them is the question again.
    searched = [trace("q1", [(["Dijon", "birth"], {QUESTION: ["p4"], "Dijon": ["p5"], "birth": ["p2"]})]),
                trace("q2", [(["x"], {QUESTION: ["p4"], "Where was Eiffel born": ["p4"], "x": ["p1"]})])]
    for record in searched:
        record.rounds[0].extra[QUESTION_SEARCHED] = True
    summary = run_summary(read_searches(write(tmp_path / "traces.jsonl", searched))[0])
    assert summary["searches_per_question"] == 3  # the question's search is a search
    assert summary["words_per_query"] == pytest.approx((1 + 1 + 4 + 1) / 4)  # but no written sub-query
    assert summary["echo_share"] == pytest.approx(1 / 2)  # only q2's writer echoed the question
    assert (summary["recall_echo"], summary["recall_no_echo"]) == (pytest.approx(0.5), pytest.approx(1.0))


def test_gold_only_the_run_or_only_the_reference_found(runs):
    maps_path, vanilla_path = runs
    against = against_summary(read_searches(maps_path)[0], read_searches(vanilla_path)[0])
    # q1: both p4. q2: both p5, vanilla only p4. q3: vanilla only p4.
    assert (against["questions"], against["gold"]) == (3, 6)
    assert (against["both"], against["run_only"], against["reference_only"]) == (2, 0, 2)
    assert (against["questions_echo"], against["questions_no_echo"]) == (1, 2)
    assert against["run_recall_echo"] == against["reference_recall_echo"] == pytest.approx(0.5)
    assert against["run_recall_no_echo"] == pytest.approx(0.25)
    assert against["reference_recall_no_echo"] == pytest.approx(0.75)
    table = queries_markdown([("maps", run_summary(*read_searches(maps_path)))], [("maps", "vanilla", against)])
    assert "| maps | 3 | 1 | 2.33 | 1.75 | 1.6 | 33.3 | 33.3 | 50.0 | 25.0 |" in table
    assert "| maps | vanilla | 3 | 6 | 2 | 0 | 2 | 33.3 / 66.7 | 50.0 / 50.0 (1) | 25.0 / 75.0 (2) |" in table


def test_the_cli_writes_both_tables(runs, tmp_path):
    maps_path, vanilla_path = runs
    out = tmp_path / "report" / "queries.md"
    result = CliRunner().invoke(app, ["analyze", "queries", str(maps_path), "--against", str(vanilla_path),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = out.read_text()
    assert "| 33.3 / 66.7 |" in written and written.strip() in result.output


def test_a_malformed_line_and_a_missing_run_are_one_line_errors(runs, tmp_path):
    maps_path, _ = runs
    with maps_path.open("a") as f:
        f.write('{"question_id": "q9"}\n')
    with pytest.raises(MapsTrainError, match=rf"{maps_path}:5: .*required field is missing"):
        read_searches(maps_path)
    with pytest.raises(MapsTrainError, match="no traces file"):
        read_searches(tmp_path / "nowhere")
