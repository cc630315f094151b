"""The evaluation matrix: systems x data sets, run through the agent runner, scored, reported, tracked.

A suite file (`eval/suites/*.yaml`) maps onto `SuiteConfig`. `run_suite` loads every recipe and data set first
(so a typo fails in a second, not after an hour), then for each system x data set hands the questions that have
no result yet to the agent runner, scores the answers it returns into `results.jsonl`, and rebuilds the report.

The runner contract (`maps_train.agents.runner.run_method`):
    run_method(recipe: Recipe, questions: list[Question], out_dir: Path, progress: bool = True)
        -> list[AnswerRecord]
writes `answers.jsonl` (and its traces) in `out_dir`, append-only and resumable by question id, and returns one
`maps_train.records.AnswerRecord` per given question, including those answered by an earlier, interrupted call.
A runner of another tool may return plain dicts: they are read with `AnswerRecord.from_dict`, which requires
`question_id` and `answer`, checks every other field's type, and counts missing cost counters as 0.

Layout of `out_dir`: suite.yaml, samples.json (seed, size and ids of every sample; both written atomically),
results.jsonl, the report files (see `report.py`), `runs/<system>/<dataset>/` (the runner's answers.jsonl and
traces), `wandb/`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from maps_train import safejson
from maps_train.config.names import check_plain_name
from maps_train.config.overlays import load_config
from maps_train.config.redaction import redact_secrets
from maps_train.config.yaml_io import dump_yaml, to_dict
from maps_train.errors import ConfigError, MapsTrainError, io_errors
from maps_train.evaluate.cost import ParameterLookup
from maps_train.evaluate.datasets import dataset_info, load_eval_questions, sample
from maps_train.evaluate.evidence_recall import RECALL_KEYS, CorpusLookups, gap_warning, run_evidence
from maps_train.evaluate.report import RESULTS, SUITE_MANIFEST, ReportFiles, build_report
from maps_train.evaluate.results import read_results, results_file, score_record
from maps_train.evaluate.summary import AVG
from maps_train.paths import write_text_atomic
from maps_train.questions import Question
from maps_train.records.answer import AnswerRecord
from maps_train.records.hints import refuse_hint
from maps_train.records.shards import Shard
from maps_train.records.store import absent
from maps_train.runlock import sole_writer
from maps_train.tracking import Tracker, WandbConfig, artifact_name, make_tracker

RunMethod = Callable[..., list[AnswerRecord | dict[str, Any]]]
SAMPLES_FILE = "samples.json"


@dataclass
class DatasetSpec:
    name: str  # a registry name (nq, popqa, 2wikimultihopqa, hotpotqa, musique, gpqa) or your own with `path`
    path: str | None = None  # a local FlashRAG JSONL (or GPQA CSV); default <data_root>/<name>/<split>.jsonl
    hub: str | None = None  # e.g. RUC-NLPIR/FlashRAG_datasets (online only)
    config: str | None = None  # hub config; the registry's (or `name`) when null
    split: str | None = None  # the registry's when null
    sample: int | None = None  # questions drawn at random; all when null
    seed: int = 0  # sampling seed, and GPQA's option-shuffle seed
    label: str | None = None  # column title; the registry's when null


@dataclass
class SystemDefaults:
    """What every system of a suite shares, stated once (`defaults:`): a system's own fields come after these."""

    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)  # before each system's own overrides (which win)
    params_billion: float | None = None


@dataclass
class SystemSpec:
    name: str
    recipe: str = ""  # a recipe YAML, relative to the working directory (else to the suite file); "": defaults.recipe
    overrides: list[str] = field(default_factory=list)  # dotted recipe overrides, e.g. agent.method=vanilla
    params_billion: float | None = None  # model size for the compute estimate; counted from the model when null
    # Which routes the roles take: the recipe's own (in a distillation recipe, the teacher); `distilled`: the
    # student base with one LoRA adapter per role on an offline vLLM engine; `distilled_server`: the same through a
    # running `maps-train serve` (backend.base_urls); `student_base`: every role on the student base, no adapters.
    routes: Literal["recipe", "distilled", "distilled_server", "student_base"] = "recipe"
    # With routes `distilled`: adapter name -> the folder that replaces its distilled one, e.g. a stage trained
    # after SFT ({writer: runs/x/rl/adapters/writer}); the other adapters stay the distilled ones.
    adapters: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # printed under the report's Cover-EM table (e.g. "prompted protocol, not RL-trained")
    # A reference recipe (the paper's): every answer-deciding setting where this system differs from it, run with
    # this system's method, is listed in `departures` when the suite runs and printed under the Cover-EM table.
    departs_from: str | None = None
    departures: list[str] = field(default_factory=list)  # written by run_suite from departs_from, not by hand


@dataclass
class SuiteConfig:
    name: str = "suite"
    out_dir: str = "runs/eval"
    data_root: str = "data"  # default local layout <data_root>/<name>/<split>.jsonl (FlashRAG's)
    datasets: list[DatasetSpec] = field(default_factory=list)
    defaults: SystemDefaults = field(default_factory=SystemDefaults)  # shared by every system
    systems: list[SystemSpec] = field(default_factory=list)
    wandb: WandbConfig = field(default_factory=lambda: WandbConfig(project="maps-train-eval"))
    # Answer normalisation for Cover-EM/EM/F1: FlashRAG's `normalize_answer` (the paper's protocol), or "unicode"
    # (also Unicode punctuation and NFC; see maps_train/records/metrics.py).
    normalizer: Literal["flashrag", "unicode"] = "flashrag"
    # (system, data set) runs in flight at once. Above 1, runs on the same engines overlap (an in-process vLLM
    # engine or a `vllm serve` fleet batches every run's calls together), so small runs no longer leave the engine
    # idle; runs on other engines wait for the next wave (two engines on the same cores slow each other down far
    # more than they gain). Each run is scored the moment it is done. 1: one run after another.
    parallel_runs: int = 1


@dataclass
class SuiteOutcome:
    out_dir: Path
    results_path: Path
    summary: dict[str, Any]
    files: ReportFiles
    scored: int  # results written by this call
    unanswered: int  # questions the runner returned no answer for


def load_suite(path: str | Path, overrides: Sequence[str] = ()) -> SuiteConfig:
    suite = load_config(SuiteConfig, path, overrides)
    check_plain_name(suite.name, f"{path}: name")  # names become folders and W&B runs: never a path
    for kind, specs in (("datasets", suite.datasets), ("systems", suite.systems)):
        if not specs:
            raise ConfigError(f"{path}: {kind}: the suite lists none")
        names = [s.name for s in specs]
        for index, name in enumerate(names):
            check_plain_name(name, f"{path}: {kind}[{index}].name")
            if names.index(name) != index:
                raise ConfigError(f"{path}: {kind}[{index}].name: '{name}' appears twice")
    return with_defaults(suite, path)


def with_defaults(suite: SuiteConfig, path: str | Path) -> SuiteConfig:
    """Each system with the suite's `defaults:` under its own fields: the default recipe where it names none, the
    default overrides before its own (so its own win), the default model size where it gives none."""
    defaults = suite.defaults
    for index, system in enumerate(suite.systems):
        system.recipe = system.recipe or defaults.recipe or ""
        if not system.recipe:
            raise ConfigError(f"{path}: systems[{index}].recipe: missing (and the suite's defaults name none)")
        system.overrides = [*defaults.overrides, *system.overrides]
        if system.params_billion is None:
            system.params_billion = defaults.params_billion
    suite.defaults = SystemDefaults()  # applied: a suite dumped or reloaded from here does not apply it twice
    return suite


def resolve_recipe_path(recipe: str, suite_path: Path, where: str) -> Path:
    for candidate in (Path(recipe), suite_path.parent / recipe):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{suite_path}: {where}: recipe '{recipe}' not found (relative to the working directory or the suite)")


def apply_routes(recipe: Any, routes: str, adapters: dict[str, str] | None = None) -> Any:
    """The recipe with the role routes a system asks for (see `SystemSpec.routes` and `SystemSpec.adapters`)."""
    if adapters and routes != "distilled":
        raise ConfigError(f"adapters: replaces distilled adapter folders, so only with routes: distilled (not {routes})")
    if routes == "recipe":
        return recipe
    if routes in ("distilled", "distilled_server"):
        from maps_train.recipe import adapter_of_role
        from maps_train.serve import with_distilled_routes

        routed = with_distilled_routes(recipe, via="engine" if routes == "distilled" else "server")
        of_role = adapter_of_role(recipe)
        unknown = sorted(set(adapters or {}) - set(of_role.values()))
        if unknown:
            raise ConfigError(f"adapters: {', '.join(unknown)}: not an adapter of the recipe "
                              f"(its adapters: {', '.join(sorted(set(of_role.values())))})")
        named = {**of_role, "default": of_role.get("consolidator")}
        roles = {role: replace(route, adapter=swapped_adapter(role, route.adapter, (adapters or {}).get(named.get(role))))
                 for role, route in routed.roles.items()}
        return replace(routed, roles=roles)
    template = recipe.route("default")
    student = replace(
        template,
        model=recipe.serve.base_model or recipe.train.student,
        adapter=None,
        enable_thinking=recipe.sft_data.enable_thinking,
    )
    return replace(recipe, roles={"default": student})


def swapped_adapter(role: str, distilled: str | None, swap: str | None) -> str | None:
    """The adapter a role runs with when a system swaps in another folder (`adapters:`) for its distilled one
    (`distilled`: None where the distilled adapter never learned the role, so the base model serves it). The swap
    serves the role when the folder's own record says it learned it (an RL adapter's trained roles, an SFT
    adapter's rows: `serve.plan.learned_roles`); with no record, where the distilled adapter did."""
    from maps_train.serve.plan import learned_roles

    if swap is None:
        return distilled
    learned = learned_roles(Path(swap))
    trace_role = "consolidator" if role == "default" else role  # the default route is the consolidator's
    serves = trace_role in learned if learned is not None else distilled is not None
    return swap if serves else None


def system_departures(spec: SystemSpec, index: int, suite_path: Path) -> list[str]:
    """Where the system's resolved recipe departs from `spec.departs_from` (see `evaluate.departures`)."""
    from maps_train.evaluate.departures import departures
    from maps_train.recipe import load_recipe

    path = resolve_recipe_path(spec.recipe, suite_path, f"systems[{index}].recipe")
    mine = apply_routes(load_recipe(str(path), spec.overrides), spec.routes, spec.adapters)
    reference = resolve_recipe_path(spec.departs_from, suite_path, f"systems[{index}].departs_from")
    return departures(mine, load_recipe(str(reference), [f"agent.method={mine.agent.method}"]))


def load_system_recipe(spec: SystemSpec, index: int, suite_path: Path) -> Any:
    from maps_train.recipe import load_recipe

    path = resolve_recipe_path(spec.recipe, suite_path, f"systems[{index}].recipe")
    recipe = apply_routes(load_recipe(str(path), spec.overrides), spec.routes, spec.adapters)
    refuse_hint(recipe.agent.hint, f"{suite_path}: systems[{index}] ({spec.name}): ", "an evaluation must not use it")
    if spec.routes == "distilled":  # fail now, not when the engine loads the first adapter an hour in
        for role, route in recipe.roles.items():
            if route.adapter and not Path(route.adapter).is_dir():
                raise ConfigError(
                    f"{suite_path}: systems[{index}] ({spec.name}): adapter of role '{role}' not found at "
                    f"{route.adapter} (train it first: maps-train train {spec.recipe})"
                )
    return recipe


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


def _log_tracking(tracker: Tracker, suite: SuiteConfig, recipes: dict, summary: dict, files: ReportFiles, out_dir: Path) -> None:
    rows = read_results(out_dir / RESULTS)
    columns = [
        "dataset", "question_id", "question", "golden_answers", "answer", "cover_em", "em", "f1", "answer_words",
        "rounds", "stop_reason", "calls", "prompt_tokens", "completion_tokens", "retrievals", "latency_s", "compute_tflops",
    ]
    for spec in suite.systems:
        if spec.name not in summary["cells"]:
            continue
        tracker.start_run(
            spec.name,
            {"suite": suite.name, "system": to_dict(spec), "recipe": to_dict(recipes[spec.name]),
             "datasets": to_dict(suite.datasets)},
            job_type="eval",
        )
        if spec.routes in ("distilled", "distilled_server"):  # link the results to the adapters they came from
            from maps_train.train.sft import adapter_artifacts

            for name, folder in adapter_artifacts(recipes[spec.name]):
                tracker.use_artifact(name, "adapter", folder)
        tracker.log_artifact(artifact_name("eval", f"{suite.name}-{spec.name}"), "eval", out_dir / RESULTS)
        metrics: dict[str, Any] = {}
        for dataset, cell in summary["cells"][spec.name].items():
            label = summary["labels"].get(dataset, dataset)
            for key in ("cover_em", "em", "f1", "answer_words", "n", "calls", "prompt_tokens", "completion_tokens",
                        "retrievals", "passages", "latency_s", "compute_tflops"):
                if cell.get(key) is not None:
                    metrics[f"{label}/{key}"] = cell[key]
        for dataset, cell in summary.get("evidence", {}).get(spec.name, {}).items():
            label = summary["labels"].get(dataset, dataset)
            metrics.update({f"{label}/{key}": cell[key] for key in RECALL_KEYS if cell[key] is not None})
        tracker.log_summary(metrics)
        table = [
            [r["dataset"], r["question_id"], r["question"], " | ".join(r["golden_answers"]), r["answer"], r["cover_em"],
             r["em"], r["f1"], r["answer_words"], r.get("rounds"), r.get("stop_reason"), r["cost"]["calls"],
             r["cost"]["prompt_tokens"], r["cost"]["completion_tokens"], r["cost"]["retrievals"], r["cost"]["latency_s"],
             None if r.get("compute_flops") is None else r["compute_flops"] / 1e12]
            for r in rows if r["system"] == spec.name
        ]
        tracker.log_table("results", columns, table)
        # Per question, Cover-EM against tokens: W&B's own scatter, so any other column can be tried in the UI.
        tracker.log_scatter("cover_em_vs_tokens", ["question_id", "dataset", "tokens", "cover_em", "compute_tflops"],
                            [[row[1], row[0], row[12] + row[13], row[5], row[16]] for row in table],
                            x="tokens", y="cover_em", title=f"{spec.name}: Cover-EM vs tokens per question")
        tracker.log_image("cover_em_vs_cost", files.cost_plot)
        if files.evidence_plot is not None:
            tracker.log_image("evidence_recall_vs_cost", files.evidence_plot)
        tracker.log_image("stop_rounds", files.rounds_plot)
        tracker.finish_run()


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
            _log_tracking(tracker, replace(suite, systems=system_specs), recipes, summary, files, out_dir)
        return SuiteOutcome(out_dir, out_dir / RESULTS, summary, files, scored, unanswered)


def read_samples(path: Path) -> dict[str, Any]:
    """samples.json as written (data set -> seed, sizes, ids); absent: empty. Damage is a one-line error naming
    the file, never silently replaced: it holds the samples of data sets this run may not touch."""
    if absent(path):
        return {}
    with io_errors(path, "read"):
        data = path.read_bytes()
    try:
        samples = safejson.loads(data)
    except safejson.JSONLimitError as err:
        raise MapsTrainError(f"{path}: invalid JSON ({err}); delete it to write it anew") from None
    if not isinstance(samples, dict):
        raise MapsTrainError(f"{path}: expected a JSON object (data set -> sample); delete it to write it anew")
    return samples


def write_samples(path: Path, questions: dict[str, list[Question]]) -> None:
    """Record each data set's sample (seed, sizes, ids) in samples.json, keeping other data sets' entries; written
    atomically, so a kill or a full disk mid-write leaves the previous file whole."""
    samples = read_samples(path)
    for name, chosen in questions.items():
        record = chosen[0].metadata["sample"] if chosen else {"seed": None, "n": 0, "population": 0}
        samples[name] = {**record, "question_ids": [q.id for q in chosen]}
    write_text_atomic(path, json.dumps(samples, indent=1) + "\n")


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


__all__ = [
    "AVG", "DatasetSpec", "SuiteConfig", "SuiteOutcome", "SystemSpec", "load_suite", "load_suite_questions", "run_suite",
]
