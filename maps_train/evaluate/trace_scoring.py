"""A teacher's traces scored as one eval system's rows (`maps-train score-traces`): the teacher row of a study's
table. The annotation teacher is refused by every evaluation (it reads the gold annotations), so its traces on the
dev questions are scored here, with the same fields as an eval row (`evaluate.results.score_record`) and the same
evidence recall (`evaluate.evidence_recall`), into a suite's `results.jsonl` through the keyed store: a rerun writes
nothing twice."""

from __future__ import annotations

from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.evaluate.evidence_recall import run_evidence
from maps_train.evaluate.results import results_file, score_record
from maps_train.questions import load_questions
from maps_train.records.answer import AnswerRecord
from maps_train.records.shards import ANSWERS_FILE
from maps_train.records.store import KeyedJsonl


def score_traces(traces_dir: Path, questions_files: list[str], system: str, results: Path,
                 corpus: str | None = None) -> tuple[int, int]:
    """Score every run folder under `traces_dir` (each `answers.jsonl` beside its `traces.jsonl`) into `results`
    rows of `system`, as an eval suite scores its runs (`evaluate.results.score_record`, evidence recall from the
    traces); rows already there are kept and not written again. Returns (rows written, questions with no question
    row in `questions_files`)."""
    questions = {q.id: q for path in questions_files for q in load_questions(path)}
    runs = sorted(path.parent for path in Path(traces_dir).rglob(ANSWERS_FILE)
                  if not {"shards", "sft"} & set(path.relative_to(traces_dir).parts[:-1]))
    if not runs:
        raise MapsTrainError(f"{traces_dir}: no {ANSWERS_FILE} under it (a traces folder of maps-train traces)")
    store = results_file(results)
    done = set(store.load())
    written = unknown = 0
    with store:
        for run_dir in runs:
            answers = {}
            for key, row in KeyedJsonl(run_dir / ANSWERS_FILE).load(repair=False).items():
                answers[key] = AnswerRecord.from_dict(row, f"{run_dir / ANSWERS_FILE}")
            unknown += sum(1 for qid in answers if qid not in questions)
            pending = [questions[qid] for qid in answers if qid in questions
                       and (system, questions[qid].dataset, qid) not in done]
            evidence = run_evidence(run_dir, pending, corpus)
            rows = [score_record(q, answers[q.id], system, "choice" if q.options else "short", lambda role: None,
                                 evidence=evidence.get(q.id)) for q in pending]
            written += store.extend(rows)
            done.update((system, q.dataset, q.id) for q in pending)
    return written, unknown
