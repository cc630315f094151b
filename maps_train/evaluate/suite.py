"""The evaluation matrix: systems x data sets, run through the agent runner, scored, reported, tracked.

A suite file (`eval/suites/*.yaml`) maps onto `SuiteConfig` (`suite_spec`: the specs, each system's recipe with
its routes). `run_suite` loads every recipe and data set first
(so a typo fails in a second, not after an hour), then for each system x data set hands the questions that have
no result yet to the agent runner, scores the answers it returns into `results.jsonl`, and rebuilds the report.

The runner contract (`maps_train.agents.runner.run_method`):
    run_method(recipe: Recipe, questions: list[Question], out_dir: Path, progress: bool = True)
        -> list[AnswerRecord]
writes `answers.jsonl` (and its traces) in `out_dir`, append-only and resumable by question id, and returns one
`maps_train.records.AnswerRecord` per given question, including those answered by an earlier, interrupted call.
A runner of another tool may return plain dicts: they are read with `AnswerRecord.from_dict`, which requires
`question_id` and `answer`, checks every other field's type, and counts missing cost counters as 0.

Layout of `out_dir`: suite.yaml, samples.json (`samples`: seed, size and ids of every sample; both written atomically),
results.jsonl, the report files (see `report.py`), `runs/<system>/<dataset>/` (the runner's answers.jsonl and
traces), `wandb/` (`suite_tracking`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from maps_train.config.redaction import redact_secrets
from maps_train.config.yaml_io import dump_yaml
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.evaluate.cost import ParameterLookup
from maps_train.evaluate.datasets import dataset_info, load_eval_questions, sample
from maps_train.evaluate.evidence_recall import CorpusLookups, gap_warning, run_evidence
from maps_train.evaluate.report import RESULTS, SUITE_MANIFEST, ReportFiles, build_report
from maps_train.evaluate.results import results_file, score_record
from maps_train.evaluate.samples import SAMPLES_FILE, read_samples, write_samples
from maps_train.evaluate.suite_spec import (
    DatasetSpec,
    SuiteConfig,
    SystemDefaults,
    SystemSpec,
    apply_routes,
    load_suite,
    load_system_recipe,
    resolve_recipe_path,
    system_departures,
    with_defaults,
)
from maps_train.evaluate.suite_tracking import log_suite_runs
from maps_train.evaluate.summary import AVG
from maps_train.paths import write_text_atomic
from maps_train.questions import Question
from maps_train.records.answer import AnswerRecord
from maps_train.records.shards import Shard
from maps_train.runlock import sole_writer
from maps_train.tracking import Tracker, make_tracker

RunMethod = Callable[..., list[AnswerRecord | dict[str, Any]]]


@dataclass
class SuiteOutcome:
    out_dir: Path
    results_path: Path
    summary: dict[str, Any]
    files: ReportFiles
    scored: int  # results written by this call
    unanswered: int  # questions the runner returned no answer for

def default_runner() -> RunMethod:
    from maps_train.agents.runner import run_method

    return run_method


def _select(specs: list, names: Sequence[str] | None, kind: str, path: Path) -> list:
    if not names:
        return specs
    known = {s.name for s in specs}
    for name in names:
        if name not in known:
            raise MapsTrainError(f"{path}: no {kind} named '{name}' (known: {', '.join(sorted(known))})")
    return [s for s in specs if s.name in names]


def load_suite_questions(suite: SuiteConfig, specs: list[DatasetSpec], suite_path: Path) -> dict[str, list[Question]]:
    """Every data set of the suite, sampled (the loaders refuse duplicate ids: results are keyed by id)."""
    questions = {}
    for spec in specs:
        loaded = load_eval_questions(
            spec.name, path=spec.path, hub=spec.hub, split=spec.split, seed=spec.seed,
            data_root=suite.data_root, config=spec.config,
        )
        questions[spec.name] = sample(loaded, spec.sample, spec.seed)
    return questions


def _answer_mode(name: str, question: Question) -> str:
    info = dataset_info(name)
    if info is not None:
        return info.answer_mode
    return "choice" if question.options else "short"

def run_suite(
    suite_path: str | Path,
    overrides: Sequence[str] = (),
    *,
    runner: RunMethod | None = None,
    tracker: Tracker | None = None,
    systems: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    sample_size: int | None = None,
    progress: bool = True,
    shard: Shard | None = None,
    engines: Any = None,
) -> SuiteOutcome:
    """Run (or resume) a suite and rebuild its report; returns the summary and the report files.

    `runner` defaults to `maps_train.agents.runner.run_method`; `systems`/`datasets` restrict the matrix;
    `sample_size` replaces every data set's `sample` (a smoke run: with the same seed it is a prefix of the full
    sample, so its results count towards the full run). `shard`: only its questions of every sample, the whole
    suite written under `<out_dir>/shards/I-of-N/` (`maps-train merge-shards OUT_DIR`, then `maps-train report
    OUT_DIR`).
    `engines`: an `EnginePool` a given `runner` leases each run's engines from (it is called with `backend=` the
    leased router; the caller closes the pool); without a runner the real agent uses a pool of its own.
    """

    suite_path = Path(suite_path)
    suite = load_suite(suite_path, overrides)
    for index, spec in enumerate(suite.systems):  # every system, so the manifest keeps them all
        spec.departures = system_departures(spec, index, suite_path) if spec.departs_from else []
    if sample_size is not None:
        suite.datasets = [replace(d, sample=sample_size) for d in suite.datasets]
    system_specs = _select(suite.systems, systems, "system", suite_path)
    dataset_specs = _select(suite.datasets, datasets, "dataset", suite_path)

    recipes = {spec.name: load_system_recipe(spec, i, suite_path) for i, spec in enumerate(suite.systems) if spec in system_specs}
    questions = load_suite_questions(suite, dataset_specs, suite_path)

    out_dir = Path(suite.out_dir) if shard is None else shard.out_dir(suite.out_dir)
    # One writer per suite folder: two evals of one suite would score every question twice.
    with sole_writer(out_dir, "maps-train eval"):
        write_text_atomic(out_dir / SUITE_MANIFEST, dump_yaml(redact_secrets(suite)))
        write_samples(out_dir / SAMPLES_FILE, questions)
        if shard is not None:  # samples.json keeps the whole sample: every shard's copy is the same
            questions = {name: shard.select(chosen) for name, chosen in questions.items()}

        pool = None
        if runner is None:
            # The real agent: systems on the same base model share one engine, and a finished system's engine is
            # closed before one that would not fit beside it starts (see maps_train.llm.pool).
            from maps_train.llm.pool import EnginePool

            pool, run_method = EnginePool(), default_runner()

            # ... and runs with the same retrieval config share one retriever: the index is loaded once per suite.
            from maps_train.retrieval.factory import RetrieverPool

            retrievers = RetrieverPool()

            def runner(recipe, pending, run_dir, progress=True):
                with pool.lease(recipe) as router:  # held for the whole run: its engines stay open until it ends
                    return run_method(recipe, pending, run_dir, backend=router,
                                      retriever=retrievers.get(recipe.retrieval), progress=progress)
        elif engines is not None:
            runner = leasing_runner(runner, engines)

        try:
            scored, unanswered = _run_matrix(suite, system_specs, dataset_specs, recipes, questions, out_dir, runner, progress)
        finally:
            if pool is not None:
                pool.close()
                retrievers.close()

        summary, files = build_report(out_dir)
        if scored:
            tracker = tracker or make_tracker(suite.wandb, suite.name, out_dir)
            log_suite_runs(tracker, replace(suite, systems=system_specs), recipes, summary, files, out_dir)
        return SuiteOutcome(out_dir, out_dir / RESULTS, summary, files, scored, unanswered)

def leasing_runner(run_method: RunMethod, engines: Any) -> RunMethod:
    """`run_method` with each run's engines leased from the pool for the whole run (see maps_train.llm.pool)."""

    def runner(recipe, pending, run_dir, progress=True):
        with engines.lease(recipe) as router:
            return run_method(recipe, pending, run_dir, backend=router, progress=progress)

    return runner


def engines_of(recipe: Any) -> tuple:
    """The engines a system's routes run on (kind and model; the server URLs for openai routes)."""
    from maps_train.llm.router import engine_key

    keys = set()
    for route in recipe.roles.values():
        keys.add(engine_key(route) + (f"@{','.join(recipe.backend.base_urls)}" if route.backend == "openai" else ""))
    return tuple(sorted(keys))


def _run_matrix(suite, system_specs, dataset_specs, recipes, questions, out_dir, runner, progress) -> tuple[int, int]:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm.auto import tqdm

    results = results_file(out_dir / RESULTS)
    done = set(results.load())
    runs = []  # (system, data set, questions still to score)
    for system, spec in ((s, d) for s in system_specs for d in dataset_specs):
        pending = [q for q in questions[spec.name] if (system.name, spec.name, q.id) not in done]
        if pending:
            runs.append((system, spec, pending))
    if suite.parallel_runs < 1:
        raise ConfigError(f"parallel_runs: must be at least 1, got {suite.parallel_runs}")
    parallel = min(suite.parallel_runs, max(1, len(runs)))
    totals = {"scored": 0, "unanswered": 0}
    corpus_lookups = CorpusLookups()  # evidence recall reads each corpus once for all runs, not once per run
    bar = tqdm(total=len(runs), desc=f"suite {suite.name}", unit="run", disable=not progress)

    def answer(system, spec, pending):
        run_dir = out_dir / "runs" / system.name / spec.name
        return runner(recipes[system.name], pending, run_dir, progress=progress and parallel == 1)

    def score(system, spec, pending, records) -> None:
        """Scored rows of one finished run, appended (on this thread only)."""
        where = f"{out_dir / 'runs' / system.name / spec.name}/answers.jsonl"
        answers = {}
        for record in records:
            record = AnswerRecord.from_dict(record, where)
            answers[record.question_id] = record
        lookup = ParameterLookup(recipes[system.name], system.params_billion)
        run_dir = out_dir / "runs" / system.name / spec.name
        evidence = run_evidence(run_dir, pending, recipes[system.name].retrieval.corpus, corpus_lookups)
        gaps = gap_warning(evidence.get(q.id, {}) for q in pending)
        if gaps:  # gold that no search can find: said per data set, not folded silently into the recall
            print(f"maps-train eval: warning: {system.name}/{spec.name}: {gaps}", file=sys.stderr)
        rows = [
            score_record(q, answers[q.id], system.name, _answer_mode(spec.name, q), lookup, suite.normalizer,
                         evidence.get(q.id))
            for q in pending
            if q.id in answers
        ]
        with results:
            totals["scored"] += results.extend(rows)
        missing = len(pending) - len(rows)
        if missing:
            totals["unanswered"] += missing
            print(f"maps-train eval: {system.name}/{spec.name}: {missing} questions got no answer; rerun to retry",
                  file=sys.stderr)
        bar.update(1)

    try:
        if parallel == 1:
            for run in runs:
                score(*run, answer(*run))
        else:
            waves: dict[tuple, list] = {}  # runs on the same engines, in suite order
            for run in runs:
                waves.setdefault(engines_of(recipes[run[0].name]), []).append(run)
            for wave in waves.values():
                pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="suite-run")
                futures = {pool.submit(answer, *run): run for run in wave}
                try:
                    for future in as_completed(futures):
                        score(*futures[future], future.result())
                finally:  # a failed run stops the rest not yet started; finished runs' answers stay on disk
                    pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()
        corpus_lookups.close()
    return totals["scored"], totals["unanswered"]


__all__ = [  # the suite's specs (suite_spec), samples (samples) and W&B runs (suite_tracking) are named here too
    "AVG", "SAMPLES_FILE", "DatasetSpec", "SuiteConfig", "SuiteOutcome", "SystemDefaults", "SystemSpec",
    "apply_routes", "load_suite", "load_suite_questions", "load_system_recipe", "read_samples", "resolve_recipe_path",
    "run_suite", "system_departures", "with_defaults", "write_samples",
]
