"""Evidence recall says what it cannot match: gold ids the corpus does not hold and gold entries that are malformed
are counted per question (`gold_absent`, `gold_malformed` on its result row) and summed per data set in a warning,
instead of being scored as silent misses or dropping the question from the evidence table. Real corpus reader
(`PassageLookup`), real gold readers."""

from __future__ import annotations

import json

from maps_train.evaluate.evidence_recall import CorpusLookups, gap_warning, run_evidence
from maps_train.questions import Question


def question(qid: str, metadata: dict) -> Question:
    return Question(id=qid, question=f"{qid}?", golden_answers=["a"], dataset="toy", metadata=metadata)


def test_absent_ids_and_malformed_gold_are_counted_and_warned(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": pid, "contents": f"{pid}\ntext of {pid}"}) + "\n"
                              for pid in ("p1", "p2")))
    questions = [
        question("q1", {"supporting_paragraphs": [{"corpus_id": "p1"}, {"corpus_id": "gone"}]}),
        question("q2", {"supporting_paragraphs": ["not an object", {"title": "only a title"}]}),
        question("q3", {"paragraphs": [{"title": "t", "is_supporting": True}, {"title": "u", "text": "x"}]}),
        question("q4", {"supporting_facts": [["Missing", 0]], "context": [["Other", ["a sentence"]]]}),
        question("q5", {"supporting_paragraphs": [{"corpus_id": "p2"}]}),
        question("q6", {}),
    ]
    lookups = CorpusLookups()
    try:
        fields = run_evidence(tmp_path / "run", questions, corpus, lookups)
    finally:
        lookups.close()
    assert fields["q1"] == {"gold_passages": 2, "evidence_recall": None, "evidence_recall_seen": None,
                            "gold_absent": 1}
    assert fields["q2"] == {"gold_malformed": 2}  # no usable gold: kept out of the recall, but counted
    assert fields["q3"] == {"gold_malformed": 1}
    assert fields["q4"] == {"gold_malformed": 1}
    assert fields["q5"] == {"gold_passages": 1, "evidence_recall": None, "evidence_recall_seen": None}
    assert fields["q6"] == {}
    assert gap_warning(fields.values()) == (
        "5 gold passages of 4 questions cannot be matched (1 ids absent from the corpus, 4 malformed gold entries); "
        "evidence recall counts absent ones as misses and leaves malformed ones out")
    assert gap_warning([fields["q5"], fields["q6"]]) is None


def test_without_a_corpus_here_no_id_is_called_absent(tmp_path):
    fields = run_evidence(tmp_path / "run", [question("q1", {"supporting_paragraphs": [{"corpus_id": "x"}]})],
                          tmp_path / "not-here.jsonl")
    assert "gold_absent" not in fields["q1"]
