"""`run_method`: a recipe's method over a list of questions, into `answers.jsonl` and `traces.jsonl`, resumable.

Questions go through the engine by `agent.schedule` (see `maps_train.agents.schedule`): each on its own
(continuous: written the moment it finishes) or in chunks of `agent.batch_size` (step: written when the chunk is
done). Each finished question appends its trace, then its answer record (both flushed); the answer file is the
record of what is done. On a rerun, questions already
in `answers.jsonl` are skipped, a torn last line is cut off, and a trace without its answer line (a kill between
the two appends) gets that line rebuilt from the trace, so the question is not run again, no complete trace is
ever deleted, and neither file ever holds a question twice. Question ids are compared exactly as written, so an
id that no UTF-8 file can hold (a lone surrogate) is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

from maps_train import safejson
from maps_train.agents.engine import Engine
from maps_train.agents.registry import engine_class
from maps_train.agents.schedule import advance
from maps_train.errors import MapsTrainError
from maps_train.llm.types import Backend
from maps_train.questions import Question
from maps_train.recipe import Recipe
from maps_train.records.answer import AnswerRecord
from maps_train.records.shards import ANSWERS_FILE, TRACES_FILE
from maps_train.records.store import KeyedJsonl
from maps_train.records.trace import TraceRecord, restore_lost_answers
from maps_train.retrieval.base import Retriever
from maps_train.runlock import sole_writer


def build_engine(recipe: Recipe, backend: Backend | None = None, retriever: Retriever | None = None) -> Engine:
    """The engine of `recipe.agent.method`, with the recipe's router and retriever unless given."""
    cls = engine_class(recipe.agent.method)
    if backend is None:
        from maps_train.llm.router import build_router

        backend = build_router(recipe)
    if retriever is None:
        from maps_train.retrieval.factory import build_retriever

        retriever = build_retriever(recipe.retrieval)
    return cls(recipe, backend, retriever)


def _check_ids(questions: list[Question]) -> None:
    """Ids are the keys of both files: unique, and written back exactly (a lone surrogate would come back as
    U+FFFD and never match again, so every rerun would answer the question once more)."""
    seen: set[str] = set()
    for question in questions:
        if question.id in seen:
            raise MapsTrainError(f"question id '{question.id}' appears twice in the input; ids must be unique")
        if safejson.has_lone_surrogate(question.id):
            raise MapsTrainError(
                f"question id {question.id[:40]!r}: holds a lone surrogate, which no UTF-8 file can store"
            )
        seen.add(question.id)


def run_method(
    recipe: Recipe,
    questions: list[Question],
    out_dir: str | Path,
    *,
    backend: Backend | None = None,
    retriever: Retriever | None = None,
    progress: bool = True,
) -> list[AnswerRecord]:
    """Answer `questions` with `recipe.agent.method`; returns their answer records (earlier runs' included), in
    input order. Writes `<out_dir>/answers.jsonl` and `<out_dir>/traces.jsonl`, holding the folder's lock
    (`runlock.sole_writer`) while it does."""
    _check_ids(questions)
    out = Path(out_dir)
    # One writer per folder: two runs into one would each answer every question (and write it twice).
    with sole_writer(out, f"maps-train ({recipe.agent.method} answers and traces)"):
        return _run_method(recipe, questions, out, backend, retriever, progress)


def _run_method(recipe: Recipe, questions: list[Question], out: Path, backend: Backend | None,
                retriever: Retriever | None, progress: bool) -> list[AnswerRecord]:
    from tqdm.auto import tqdm

    answers = KeyedJsonl(out / ANSWERS_FILE)
    traces = KeyedJsonl(out / TRACES_FILE)
    rows = answers.load()
    restore_lost_answers(answers, traces, rows)
    done = {key: AnswerRecord.from_dict(row, f"{answers.path}: question {key}") for key, row in rows.items()}

    todo = [q for q in questions if q.id not in done]
    built_backend = backend is None
    engine = None
    if todo:
        engine = build_engine(recipe, backend, retriever)
        _check_same_config(out / ANSWERS_FILE, done, engine.config_digest, recipe.agent.method)
    bar = tqdm(
        total=len(questions),
        initial=len(questions) - len(todo),
        desc=f"{recipe.agent.method} questions",
        unit="q",
        disable=not progress,
    )

    def finished(trace: TraceRecord) -> None:
        traces.append(trace.to_dict())
        record = trace.answer_record()
        answers.append(record.to_dict())
        done[trace.question_id] = record
        bar.update(1)

    try:
        with answers, traces:
            if engine is not None:
                on_step = None
                if progress:
                    on_step = lambda step: bar.set_postfix_str(  # noqa: E731
                        f"step {engine.generate_calls + engine.search_calls}: {step}"
                    )
                advance(engine, todo, finished, on_step=on_step)
    finally:
        bar.close()
        if built_backend and engine is not None and hasattr(engine.backend, "close"):
            engine.backend.close()
    return [done[q.id] for q in questions]


def _check_same_config(path: Path, done: dict[str, AnswerRecord], digest: str, method: str) -> None:
    """Refuse to mix two configurations in one output folder (their answers would not be comparable)."""
    for record in done.values():
        if record.method != method or (record.config_digest or digest) != digest:
            raise MapsTrainError(
                f"{path}: holds answers of another configuration (method {record.method}, digest "
                f"{record.config_digest}; now {method}, {digest}); use another --out folder"
            )
