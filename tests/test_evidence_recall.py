"""Evidence recall: the share of a question's gold passages its searches found (every hit) and the answer step saw,
checked against hand-counted cases: gold named by corpus id (realdata), gold known only by title and text
(FlashRAG's HotpotQA layout, matched through a real corpus file), S3's generator documents, a Search-o1 turn
that searched nothing; then a run of the real MAPS engine (scripted roles, the word-overlap retriever) scored
into result rows, the report's table and plot, and the analyses' recall by round."""

from __future__ import annotations

import json

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents.runner import run_method
from maps_train.analysis.evidence_by_round import evidence_by_round, evidence_markdown
from maps_train.analysis.runs import QuestionIndex, RunFolder
from maps_train.evaluate.evidence_recall import evidence_fields, run_evidence
from maps_train.evaluate.report import build_report
from maps_train.evaluate.results import read_results, results_file, score_record
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.answer import AnswerRecord
from maps_train.records.evidence import gold_evidence, retrieved_ids, seen_ids
from maps_train.records.store import KeyedJsonl
from maps_train.records.trace import RoundRecord, SubQueryHits, TraceRecord
from maps_train.retrieval.corpus import passages_by_id


def trace(qid: str, rounds: list[RoundRecord], method: str = "maps") -> TraceRecord:
    return TraceRecord(question_id=qid, question=f"question {qid}", dataset="toy", method=method, config_digest="d",
                       rounds=rounds, stop_reason="sufficient", final_call=None, final_answer="Dijon")


def searched(index: int, *queries: list[str], evidence: list[str] | None = None, **extra) -> RoundRecord:
    """A round whose sub-queries retrieved the given id lists; its evidence defaults to their union."""
    retrieved = [SubQueryHits(query=f"q{index}.{n}", passage_ids=ids) for n, ids in enumerate(queries)]
    if evidence is None:
        evidence = list(dict.fromkeys(pid for ids in queries for pid in ids))
    return RoundRecord(index=index, retrieved=retrieved, evidence_ids=evidence, extra=extra)


REALDATA_GOLD = {"supporting_paragraphs": [
    {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon.", "corpus_id": "p4"},
    {"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "p5"},
    {"title": "Lyon", "text": "Lyon is on the Rhone.", "corpus_id": "p7"},
]}


def question(qid: str, metadata: dict, dataset: str = "toy") -> Question:
    return Question(id=qid, question=f"question {qid}", golden_answers=["Dijon"], dataset=dataset, metadata=metadata)


def test_recall_by_corpus_id_hand_counted():
    # MAPS: of the gold p4, p5 and p7, round 1 finds p4 and round 2 only p4 again: 1 of 3, retrieved and seen.
    maps = trace("m", [searched(1, ["p1", "p4"], ["p3"]), searched(2, ["p4", "p1"], ["p2"])])
    fields = evidence_fields(question("m", REALDATA_GOLD), maps)
    assert fields == {"gold_passages": 3, "evidence_recall": 1 / 3, "evidence_recall_seen": 1 / 3}
    # S3: its searches found p4, p5 and p7 (3 of 3); its generator got only the kept p5 (1 of 3).
    s3 = trace("s", [searched(1, ["p4", "p1"]), searched(2, ["p5", "p7"], generator_passage_ids=["p5"])], "s3")
    assert retrieved_ids(s3) == ["p4", "p1", "p5", "p7"] and seen_ids(s3) == ["p5"]
    assert evidence_fields(question("s", REALDATA_GOLD), s3)["evidence_recall"] == 1.0
    assert evidence_fields(question("s", REALDATA_GOLD), s3)["evidence_recall_seen"] == pytest.approx(1 / 3)
    # Search-o1: a refused turn (no search) adds nothing; its condenser read the passages of its one search.
    o1 = trace("o", [RoundRecord(index=1, sub_queries=["a"]), searched(2, ["p7", "p5"])], "search_o1")
    assert evidence_fields(question("o", REALDATA_GOLD), o1)["evidence_recall_seen"] == pytest.approx(2 / 3)
    # No gold (GPQA, a quarter of NQ): no columns at all; gold but no trace: the count, recalls unknown.
    assert evidence_fields(question("g", {}), o1) == {}
    assert evidence_fields(question("m", REALDATA_GOLD), None) == {
        "gold_passages": 3, "evidence_recall": None, "evidence_recall_seen": None}


# FlashRAG's HotpotQA layout: supporting facts by title, paragraphs in `context`, no corpus ids.
HOTPOT_GOLD = {
    "supporting_facts": {"title": ["Gustave Eiffel", "Dijon", "Burgundy"], "sent_id": [0, 0, 1]},
    "context": {"title": ["Gustave Eiffel", "Dijon", "Paris", "Burgundy"], "sentences": [
        ["Gustave Eiffel was a French civil engineer.", "He was born in Dijon."],
        ["Dijon is a city in eastern France.", "It is the capital of Burgundy."],
        ["Paris is the capital of France."],
        ["Burgundy is a region of France.", "It is known for its wine."],
    ]},
}
# A wiki corpus in FlashRAG's format ('"Title"\ntext' contents) holding those paragraphs differently cut.
CORPUS = [
    # the whole gold paragraph with more after it, other case and punctuation: found
    ("w1", "Gustave Eiffel", "GUSTAVE EIFFEL was a French civil engineer; he was born in Dijon. He died in 1923."),
    # another paragraph under the gold title: not the gold one
    ("w2", "Dijon", "Dijon hosts a famous mustard fair every autumn."),
    # the gold text under another title: not it either
    ("w3", "Dijon (disambiguation)", "Dijon is a city in eastern France. It is the capital of Burgundy."),
    # a chunk of the gold paragraph (corpora split long paragraphs): found
    ("w4", "Burgundy", "Burgundy is a region of France."),
    ("w5", "Paris", "Paris is the capital of France."),
]


@pytest.fixture()
def wiki_corpus(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text("".join(json.dumps({"id": pid, "contents": f'"{title}"\n{text}'}) + "\n"
                            for pid, title, text in CORPUS))
    return path


def write_traces(run_dir, traces: list[TraceRecord]) -> None:
    with KeyedJsonl(run_dir / "traces.jsonl") as store:
        for record in traces:
            store.append(record.to_dict())


def test_recall_by_title_and_text_when_ids_are_absent(tmp_path, wiki_corpus):
    gold = gold_evidence(HOTPOT_GOLD)
    assert [(g.corpus_id, g.title) for g in gold] == [(None, "Gustave Eiffel"), (None, "Dijon"), (None, "Burgundy")]
    # Searches hit w1..w5: Gustave Eiffel (w1) and Burgundy (w4) are found, Dijon is not (w2, w3): 2 of 3. The
    # consolidators read round 1's merged evidence, which the trace cut to w2, w3 and w4: 1 of 3.
    hotpot = trace("h", [searched(1, ["w2", "w3"], ["w4"], evidence=["w2", "w3", "w4"]),
                         searched(2, ["w5", "w1"], evidence=[])])
    write_traces(tmp_path, [hotpot])
    scored = run_evidence(tmp_path, [question("h", HOTPOT_GOLD)], wiki_corpus)
    assert scored == {"h": {"gold_passages": 3, "evidence_recall": 2 / 3, "evidence_recall_seen": 1 / 3}}
    # The passages came from the corpus, read by id: the quoted title line is the title.
    assert passages_by_id(wiki_corpus, ["w3"])["w3"].title == "Dijon (disambiguation)"
    # Without the corpus (a remote retrieval service) nothing can be matched for gold without ids.
    assert run_evidence(tmp_path, [question("h", HOTPOT_GOLD)], tmp_path / "absent.jsonl")["h"]["evidence_recall"] == 0


def test_result_rows_report_table_and_plot(tmp_path):
    answer = AnswerRecord(question_id="m", answer="Dijon", method="maps", dataset="toy")
    maps = trace("m", [searched(1, ["p4", "p5"]), searched(2, ["p1"])])
    vanilla = trace("m", [searched(1, ["p1", "p4"])], "vanilla")
    rows = []
    for system, record in (("maps", maps), ("vanilla", vanilla)):
        for dataset, metadata in (("hotpotqa", REALDATA_GOLD), ("gpqa", {})):
            q = question("m", metadata, dataset)
            rows.append(score_record(q, answer, system, "short", lambda role: 1, evidence=evidence_fields(q, record)))
    with results_file(tmp_path / "results.jsonl") as results:
        results.extend(rows)
    hotpot_maps, gpqa_maps = read_results(tmp_path / "results.jsonl")[:2]
    assert (hotpot_maps["gold_passages"], hotpot_maps["evidence_recall"]) == (3, 2 / 3)
    assert "evidence_recall" not in gpqa_maps  # no gold passages: nothing to recall

    summary, files = build_report(tmp_path)
    assert summary["evidence"]["vanilla"]["hotpotqa"] == {"n": 1, "evidence_recall": 1 / 3,
                                                          "evidence_recall_seen": 1 / 3}
    assert "gpqa" not in summary["evidence"]["maps"]
    report = files.markdown.read_text()
    table = report.split("## Evidence recall x 100")[1].split("## EM")[0]
    assert "| System | Passages | HotpotQA | Avg |" in table  # GPQA has no gold: no column
    assert "| maps | retrieved | 66.7 (n=1) | 66.7 |" in table
    assert "| vanilla | seen by the answer step | 33.3 (n=1) | 33.3 |" in table
    assert files.evidence_plot is not None and files.evidence_plot.stat().st_size > 0
    assert files.evidence_plot in files.all()


def test_no_gold_anywhere_means_no_table_and_no_plot(tmp_path):
    answer = AnswerRecord(question_id="g", answer="A", method="maps", dataset="gpqa")
    with results_file(tmp_path / "results.jsonl") as results:
        results.extend([score_record(question("g", {}, "gpqa"), answer, "maps", "short", lambda role: 1)])
    summary, files = build_report(tmp_path)
    assert summary["evidence"] == {} and files.evidence_plot is None
    assert "Evidence recall" not in files.markdown.read_text()


def maps_writer(request, turn):
    """Queries the word-overlap retriever answers with known passages (top 2): round 1 finds p4 and p3, then p3
    and p1; round 2 finds p5 and p4."""
    queries = ["Gustave Eiffel engineer", "Eiffel Tower Paris", "Dijon Burgundy", "Dijon Burgundy"]
    return json.dumps({"query": queries[turn]})


def test_a_maps_run_scored_and_analysed_by_round(tmp_path):
    questions = [question("q0", REALDATA_GOLD), question("q1", REALDATA_GOLD), question("q2", {})]
    recipe = load_recipe(None, ["agent.method=maps", "agent.num_directions=2", "agent.top_k=2", "agent.batch_size=4"])
    scripts = {"writer": maps_writer, "consolidator": consolidator_sufficient_after({"q0": 2, "q1": 1, "q2": 1})}
    run_dir = tmp_path / "runs" / "maps" / "toy"
    run_method(recipe, questions, run_dir, backend=ScriptedBackend(scripts), retriever=RecordingRetriever(),
               progress=False)

    # q0 searched two rounds: p4 (round 1), then p5 (round 2) of p4, p5, p7; q1 stopped after round 1 with p4.
    scored = run_evidence(run_dir, questions)
    assert scored["q0"] == {"gold_passages": 3, "evidence_recall": 2 / 3, "evidence_recall_seen": 2 / 3}
    assert scored["q1"]["evidence_recall"] == pytest.approx(1 / 3) and scored["q2"] == {}

    # By round: round 1, both at 1/3; round 2, q0 at 2/3 and q1 (stopped) still at 1/3: mean 1/2, one searching.
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps({"id": q.id, "question": q.question, "metadata": q.metadata}) + "\n"
                                      for q in questions))
    stats = evidence_by_round([RunFolder("maps", "toy", run_dir)], QuestionIndex([questions_file]))
    assert [(s.system, s.questions) for s in stats] == [("maps", 2)]
    assert [stats[0].recall_at(r) for r in (1, 2)] == [pytest.approx(1 / 3), pytest.approx(1 / 2)]
    assert [stats[0].searching_at(r) for r in (1, 2)] == [2, 1]
    assert "| maps | 2 | 33.3 (2) | 50.0 (1) |" in evidence_markdown(stats)


def test_run_suite_writes_evidence_recall_into_every_row_with_gold(tmp_path):
    from maps_train.evaluate.suite import run_suite
    from maps_train.tracking import Tracker

    rows = [{"id": q.id, "question": q.question, "golden_answers": ["Dijon"], "metadata": q.metadata}
            for q in (question("q0", REALDATA_GOLD), question("q1", REALDATA_GOLD), question("q2", {}))]
    (tmp_path / "data" / "hotpotqa").mkdir(parents=True)
    (tmp_path / "data" / "hotpotqa" / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: scripted\nroles:\n  default:\n    model: Qwen/Qwen3-32B\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"name: evidence\nout_dir: {tmp_path / 'out'}\ndata_root: {tmp_path / 'data'}\n"
        "datasets:\n  - {name: hotpotqa}\nsystems:\n"
        f"  - {{name: maps, recipe: {recipe}, params_billion: 1, overrides: [agent.method=maps, "
        "agent.num_directions=2, agent.top_k=2]}\nwandb: {enabled: false}\n"
    )
    scripts = {"writer": maps_writer, "consolidator": consolidator_sufficient_after({"q0": 2, "q1": 1, "q2": 1})}

    def scripted_runner(recipe, questions, out_dir, progress=True):
        return run_method(recipe, questions, out_dir, backend=ScriptedBackend(scripts), retriever=RecordingRetriever(),
                          progress=False)

    class Recording(Tracker):
        """Keeps what the suite logs (the real Tracker without W&B logs nothing)."""

        def __init__(self):
            super().__init__()
            self.summaries, self.images = [], []

        def log_summary(self, metrics):
            self.summaries.append(metrics)

        def log_image(self, key, path):
            self.images.append(key)

    tracker = Recording()
    outcome = run_suite(suite, runner=scripted_runner, tracker=tracker, progress=False)
    assert "evidence_recall_vs_cost" in tracker.images
    assert tracker.summaries[0]["HotpotQA/evidence_recall"] == pytest.approx(1 / 2)
    by_id = {row["question_id"]: row for row in read_results(outcome.results_path)}
    assert (by_id["q0"]["evidence_recall"], by_id["q1"]["evidence_recall"]) == (2 / 3, pytest.approx(1 / 3))
    assert "evidence_recall" not in by_id["q2"]
    assert outcome.summary["evidence"]["maps"]["hotpotqa"]["evidence_recall"] == pytest.approx(1 / 2)
    assert outcome.files.evidence_plot.stat().st_size > 0
