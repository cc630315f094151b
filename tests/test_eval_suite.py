"""The suite runner: systems x data sets through an agent runner, scored into results.jsonl, resumed without
duplicates, reported as Markdown/CSV/JSON tables and PNG plots, tracked in an offline W&B run per system.

The agent itself is replaced by `FixedAnswerRunner`, a named test double of `maps_train.agents.runner.run_method`
that honours its file contract (answers.jsonl, append-only, resumable by question id) and can crash on purpose:
a real model cannot be made to fail half-way through a data set on cue. An end-to-end run with the real agent
is `run_suite(suite_path)` with no `runner` (the default imports the real one).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.evaluate.cost import count_parameters, name_parameters
from maps_train.evaluate.plots import pareto_front
from maps_train.evaluate.report import build_report
from maps_train.evaluate.results import read_results
from maps_train.evaluate.suite import load_suite, run_suite
from maps_train.questions import Question
from maps_train.tracking import Tracker, WandbConfig, make_tracker

MAPS_ROLES = ("proposer", "writer", "consolidator", "answer")


class SimulatedCrash(RuntimeError):
    pass


class FixedAnswerRunner:
    """Test double for `run_method(recipe, questions, out_dir, progress)`: fixed answers per method.

    maps: answers every question right ("It is <gold>." / "The answer is (<letter>)"), 1-3 rounds, four roles.
    vanilla: right only when the question id's character sum is even, else "I do not know" / "(A)"; one call.
    `crash_at=(method, dataset, n)` raises after writing n answers of that pair, like a killed process.
    """

    def __init__(self, crash_at: tuple[str, str, int] | None = None):
        self.crash_at = crash_at
        self.calls: list[tuple[str, str, list[str], list[str]]] = []  # (method, dataset, given ids, computed ids)

    @staticmethod
    def rounds(question: Question) -> int:
        return 1 + sum(map(ord, question.id)) % 3

    def answer(self, method: str, question: Question) -> dict:
        right = method == "maps" or sum(map(ord, question.id)) % 2 == 0
        gold = question.golden_answers[0]
        if question.options:
            text = f"The answer is ({gold})" if right else "(A)"
        else:
            text = f"It is {gold}." if right else "I do not know"
        if method == "maps":
            rounds = self.rounds(question)
            by_role = {role: {"calls": rounds if role != "answer" else 1, "prompt_tokens": 100 * rounds,
                              "completion_tokens": 20 * rounds} for role in MAPS_ROLES}
            retrievals, stop = 2 * rounds, ("sufficient" if rounds < 3 else "max_rounds")
        else:
            rounds, stop = 1, "single_pass"
            by_role = {"answer": {"calls": 1, "prompt_tokens": 300, "completion_tokens": 10}}
            retrievals = 1
        cost = {
            "calls": sum(r["calls"] for r in by_role.values()),
            "prompt_tokens": sum(r["prompt_tokens"] for r in by_role.values()),
            "completion_tokens": sum(r["completion_tokens"] for r in by_role.values()),
            "by_role": by_role, "retrievals": retrievals, "passages": 5 * retrievals, "latency_s": 0.5 * rounds,
        }
        return {"question_id": question.id, "answer": text, "method": method, "rounds": rounds, "stop_reason": stop,
                "cost": cost}

    def __call__(self, recipe, questions, out_dir, progress=True):
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "answers.jsonl"
        done = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                done[record["question_id"]] = record
        method, dataset = recipe.agent.method, questions[0].dataset
        computed = []
        with path.open("a") as handle:
            for question in questions:
                if question.id in done:
                    continue
                if self.crash_at == (method, dataset, len(computed)):
                    handle.flush()
                    self.calls.append((method, dataset, [q.id for q in questions], computed))
                    raise SimulatedCrash(f"killed in {method}/{dataset}")
                record = self.answer(method, question)
                handle.write(json.dumps(record) + "\n")
                done[question.id] = record
                computed.append(question.id)
        self.calls.append((method, dataset, [q.id for q in questions], computed))
        return [done[q.id] for q in questions]


def refusing_runner(recipe, questions, out_dir, progress=True):
    raise AssertionError("the runner must not be called when every result exists")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture()
def suite_file(tmp_path, tiny_qwen3):
    data = tmp_path / "data"
    write_jsonl(data / "nq" / "test.jsonl", [
        {"id": f"nq{i}", "question": f"who wrote book {i}", "golden_answers": [f"Author {i}", f"A. {i}"], "metadata": {}}
        for i in range(10)
    ])
    write_jsonl(data / "hotpotqa" / "dev.jsonl", [
        {"id": f"hp{i}", "question": f"which band {i}?", "golden_answers": [f"Jean-Luc Band {i}"], "metadata": {}}
        for i in range(5)
    ])
    (data / "gpqa").mkdir()
    with (data / "gpqa" / "gpqa_diamond.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                         "Incorrect Answer 3"])
        writer.writerows([[f"g{i}", f"hard question {i}", f"right {i}", "w1", "w2", "w3"] for i in range(6)])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: tiny\nroles:\n  default:\n    model: {tiny_qwen3}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"""name: unit
out_dir: {tmp_path / 'out'}
data_root: {data}
datasets:
  - {{name: nq, sample: 4, seed: 1}}
  - {{name: hotpotqa}}
  - {{name: gpqa, seed: 2}}
systems:
  - {{name: maps, recipe: recipe.yaml, overrides: [agent.method=maps]}}
  - {{name: vanilla, recipe: {recipe}, overrides: [agent.method=vanilla], params_billion: 0.5}}
wandb: {{enabled: true, project: unit, mode: offline}}
"""
    )
    return suite


def test_suite_runs_resumes_reports_and_tracks(suite_file, tiny_qwen3):
    out = suite_file.parent / "out"
    results_path = out / "results.jsonl"

    # 1. Killed in the middle of vanilla x hotpotqa, after two of its five answers.
    crashing = FixedAnswerRunner(crash_at=("vanilla", "hotpotqa", 2))
    with pytest.raises(SimulatedCrash):
        run_suite(suite_file, runner=crashing, progress=False)
    first = read_results(results_path)
    assert {(r["system"], r["dataset"]) for r in first} == {("maps", "nq"), ("maps", "hotpotqa"), ("maps", "gpqa"), ("vanilla", "nq")}
    assert len(first) == 4 + 5 + 6 + 4
    assert len((out / "runs" / "vanilla" / "hotpotqa" / "answers.jsonl").read_text().splitlines()) == 2
    assert not list(out.glob("wandb/wandb/offline-run-*"))  # nothing tracked by a run that did not finish
    # a crash while appending leaves half a line
    with results_path.open("a") as handle:
        handle.write('{"system": "vanilla", "dataset": "gp')

    # 2. Resume: only the missing pairs reach the runner, answered questions are not recomputed.
    resuming = FixedAnswerRunner()
    outcome = run_suite(suite_file, runner=resuming, progress=False)
    assert [(m, d, len(given), len(computed)) for m, d, given, computed in resuming.calls] == [
        ("vanilla", "hotpotqa", 5, 3), ("vanilla", "gpqa", 6, 6)
    ]
    rows = read_results(results_path)
    keys = [(r["system"], r["dataset"], r["question_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * (4 + 5 + 6)
    assert len(results_path.read_text().splitlines()) == len(rows)  # the torn line was dropped, none duplicated
    assert outcome.scored == 5 + 6 and outcome.unanswered == 0

    # 3. A third call finds everything done and does not call the runner.
    assert run_suite(suite_file, runner=refusing_runner, progress=False).scored == 0

    # The sample: seeded, recorded, the same ids for both systems.
    samples = json.loads((out / "samples.json").read_text())
    assert samples["nq"]["seed"] == 1 and samples["nq"]["n"] == 4 and samples["nq"]["population"] == 10
    assert {r["question_id"] for r in rows if r["dataset"] == "nq"} == set(samples["nq"]["question_ids"])

    # Scores: maps always right; vanilla right on even id sums; GPQA gold is a letter.
    summary = outcome.summary
    maps, vanilla = summary["cells"]["maps"], summary["cells"]["vanilla"]
    assert maps["nq"]["cover_em"] == maps["hotpotqa"]["cover_em"] == maps["gpqa"]["cover_em"] == 1.0
    assert maps["nq"]["em"] == 0.0 and maps["gpqa"]["em"] == 1.0  # "It is X." is not an exact match
    for dataset in ("nq", "hotpotqa"):
        ids = [r["question_id"] for r in rows if r["dataset"] == dataset and r["system"] == "vanilla"]
        expected = sum(sum(map(ord, i)) % 2 == 0 for i in ids) / len(ids)
        assert vanilla[dataset]["cover_em"] == pytest.approx(expected)
    gpqa_rows = [r for r in rows if r["dataset"] == "gpqa" and r["system"] == "vanilla"]
    assert vanilla["gpqa"]["cover_em"] == pytest.approx(
        sum((r["golden_answers"][0] == "A") or sum(map(ord, r["question_id"])) % 2 == 0 for r in gpqa_rows) / 6
    )
    assert maps["Avg"]["cover_em"] == 1.0
    assert vanilla["Avg"]["cover_em"] == pytest.approx(sum(vanilla[d]["cover_em"] for d in ("nq", "hotpotqa", "gpqa")) / 3)
    assert vanilla["nq"]["answer_words"] in {3.0, 4.0, 3.25, 3.5, 3.75}  # "It is Author 3." = 4, "I do not know" = 4
    assert vanilla["Avg"]["calls"] == 1.0 and vanilla["Avg"]["by_role"]["answer"]["prompt_tokens"] == 300

    # Compute: 2 x parameters x tokens; the tiny Qwen3's parameters counted from its safetensors headers (checked
    # against the loaded model in test_eval_e2e.py).
    params = count_parameters(tiny_qwen3)
    assert 100_000 < params < 10_000_000
    row = next(r for r in rows if r["system"] == "maps")
    tokens = row["cost"]["prompt_tokens"] + row["cost"]["completion_tokens"]
    assert row["compute_flops"] == pytest.approx(2 * params * tokens)
    assert next(r for r in rows if r["system"] == "vanilla")["compute_flops"] == pytest.approx(2 * 0.5e9 * 310)

    # Tables: Markdown in the paper's layout, CSV, JSON.
    markdown = outcome.files.markdown.read_text()
    assert "| System | NQ | HotpotQA | GPQA | Avg |" in markdown
    assert "| maps | **100.0** | **100.0** | **100.0** | **100.0** |" in markdown
    for heading in ("## EM x 100", "## Token F1 x 100", "## Answer length (words)", "## Cost per question",
                    "## Cost per role", "## Stop rounds"):
        assert heading in markdown
    with outcome.files.cover_em_csv.open() as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["system", "NQ", "HotpotQA", "GPQA", "Avg"] and table[1][0] == "maps" and table[1][1:] == ["100.0"] * 4
    with outcome.files.summary_csv.open() as handle:
        long = list(csv.DictReader(handle))
    assert {(r["system"], r["dataset"]) for r in long} >= {("maps", "Avg"), ("vanilla", "gpqa")}
    assert {"proposer_calls", "answer_prompt_tokens", "compute_tflops", "latency_s"} <= set(long[0])
    assert json.loads(outcome.files.summary_json.read_text())["systems"] == ["maps", "vanilla"]
    rounds = maps["Avg"]["rounds"]
    assert set(rounds) <= {"1", "2", "3"} and sum(rounds.values()) == 15

    # Plots: real PNGs that decode.
    import matplotlib.image

    for png in (outcome.files.cost_plot, outcome.files.rounds_plot):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(png).shape[0] > 100

    # W&B: one offline run per system, written by the call that scored new results.
    runs = sorted(out.glob("wandb/wandb/offline-run-*"))
    assert len(runs) == 2 and all(list(run.glob("*.wandb")) for run in runs)
    for run in runs:  # the per-question table and the scatter image were logged
        assert list(run.glob("files/media/table/results_*.table.json"))
        assert list(run.glob("files/media/images/cover_em_vs_cost_*.png"))

    # `report` rebuilds the same tables from results.jsonl alone.
    outcome.files.markdown.unlink()
    summary_again, files = build_report(out)
    assert files.markdown.read_text() == markdown and summary_again == summary


def test_cli_report_and_one_line_errors(suite_file, tmp_path):
    run_suite(suite_file, ["wandb.enabled=false"], runner=FixedAnswerRunner(), progress=False)
    command = [sys.executable, "-m", "maps_train.cli"]
    report = subprocess.run(command + ["report", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    assert "| System | NQ | HotpotQA | GPQA | Avg |" in report.stdout
    missing = subprocess.run(command + ["report", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "nowhere/results.jsonl: no results" in missing.stderr


def test_suite_shards_merge_into_the_whole_suite(suite_file, tmp_path):
    """Two `--shard` runs of the suite, merged: the same results and report rows as one unsharded run."""
    from maps_train.records.shards import Shard, merge_shards

    whole = run_suite(suite_file, ["wandb.enabled=false", f"out_dir={tmp_path / 'whole'}"],
                      runner=FixedAnswerRunner(), progress=False)
    runner = FixedAnswerRunner()
    for index in (1, 2):
        part = run_suite(suite_file, ["wandb.enabled=false"], runner=runner, progress=False, shard=Shard(index, 2))
        assert part.out_dir == tmp_path / "out" / "shards" / f"{index}-of-2"
    given = [(method, qid) for method, _, ids, _ in runner.calls for qid in ids]
    assert len(given) == len(set(given)) == whole.scored  # no question of a system ran in both shards
    merge_shards(tmp_path / "out")
    summary, _ = build_report(tmp_path / "out")
    key = lambda row: (row["system"], row["dataset"], row["question_id"])  # noqa: E731
    assert sorted(map(key, read_results(tmp_path / "out" / "results.jsonl"))) == sorted(
        map(key, read_results(whole.out_dir / "results.jsonl")))
    assert summary == whole.summary


def test_parallel_runs_overlap_and_score_the_same_as_one_after_another(suite_file, tmp_path):
    import threading

    whole = run_suite(suite_file, ["wandb.enabled=false", f"out_dir={tmp_path / 'one'}"],
                      runner=FixedAnswerRunner(), progress=False)
    inner, lock, running, peak = FixedAnswerRunner(), threading.Lock(), [0], [0]
    # Each run waits for all six to be in flight: runs taken one after another break the barrier at its deadline
    # (the deadline only bounds a failure, a loaded machine cannot make this pass or fail).
    all_in_flight = threading.Barrier(6, timeout=120)

    def overlapping(recipe, questions, out_dir, progress=True):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        all_in_flight.wait()
        try:
            return inner(recipe, questions, out_dir, progress)
        finally:
            with lock:
                running[0] -= 1

    parallel = run_suite(suite_file, ["wandb.enabled=false", "parallel_runs=6", f"out_dir={tmp_path / 'six'}"],
                         runner=overlapping, progress=False)
    assert peak[0] == 6 and parallel.scored == whole.scored  # 2 systems x 3 data sets, all in flight
    key = lambda row: (row["system"], row["dataset"], row["question_id"], row["cover_em"])  # noqa: E731
    assert sorted(map(key, read_results(parallel.results_path))) == sorted(map(key, read_results(whole.results_path)))
    assert parallel.summary == whole.summary


def test_suite_config_errors_are_one_line(tmp_path, suite_file):
    with pytest.raises(ConfigError, match=r"systems\[0\].recipe: recipe 'gone.yaml' not found"):
        run_suite(suite_file, ["systems=[{name: a, recipe: gone.yaml}]"], runner=refusing_runner, progress=False)
    with pytest.raises(ConfigError, match=r"datasets\[1\].name: 'nq' appears twice"):
        load_suite(suite_file, ["datasets=[{name: nq}, {name: nq}]"])
    with pytest.raises(ConfigError, match=r"datasets\[0\].sampel: unknown key \(did you mean 'sample'\?\)"):
        load_suite(suite_file, ["datasets=[{name: nq, sampel: 3}]"])
    with pytest.raises(MapsTrainError, match=r"no system named 'mapz'"):
        run_suite(suite_file, runner=refusing_runner, systems=["mapz"], progress=False)
    with pytest.raises(MapsTrainError, match=r"answers.jsonl: answer record lacks 'answer'"):
        run_suite(suite_file, ["wandb.enabled=false"], progress=False,
                  runner=lambda recipe, questions, out_dir, progress=True: [{"question_id": q.id} for q in questions])


def test_suite_on_realdata_default_layout(realdata, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: r\nroles:\n  default:\n    model: Qwen/Qwen3-32B\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"name: real\nout_dir: {tmp_path / 'out'}\ndata_root: {realdata}\n"
        "datasets: [{name: musique, sample: 3, seed: 0}, {name: popqa, sample: 3, seed: 0}]\n"
        f"systems: [{{name: maps, recipe: {recipe}, overrides: [agent.method=maps]}}]\n"
    )
    outcome = run_suite(suite, runner=FixedAnswerRunner(), progress=False)
    assert outcome.summary["cells"]["maps"]["Avg"]["cover_em"] == 1.0
    assert outcome.summary["labels"] == {"musique": "MuSiQue", "popqa": "PopQA"}
    # a hub id not in the offline cache: the size comes from its name (32e9)
    row = read_results(outcome.results_path)[0]
    assert row["compute_flops"] == pytest.approx(2 * 32e9 * (row["cost"]["prompt_tokens"] + row["cost"]["completion_tokens"]))


def test_pareto_front_and_parameter_names():
    points = [(1.0, 50.0, "cheap"), (2.0, 40.0, "dominated"), (3.0, 70.0, "good"), (5.0, 70.0, "costly-tie"), (9.0, 80.0, "best")]
    assert [p[2] for p in pareto_front(points)] == ["cheap", "good", "best"]
    assert name_parameters("Qwen/Qwen3-32B") == 32_000_000_000
    assert name_parameters("Qwen/Qwen3-0.6B") == 600_000_000
    assert name_parameters("HuggingFaceTB/SmolLM2-135M-Instruct") == 135_000_000
    assert name_parameters("sentence-transformers/all-MiniLM-L6-v2") is None


def test_null_tracker_when_disabled(tmp_path, monkeypatch):
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert type(make_tracker(WandbConfig(enabled=False), "g", tmp_path)) is Tracker
    assert type(make_tracker(WandbConfig(enabled=True, mode="disabled"), "g", tmp_path)) is Tracker
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tracker = make_tracker(WandbConfig(enabled=True, mode="online"), "g", tmp_path)
    assert type(tracker) is Tracker
    run_before = wandb.run
    # Switched off means: every call is accepted (a missing image included) and nothing is started or written.
    calls = [
        lambda: tracker.start_run("x", {}),
        lambda: tracker.log_summary({"a": 1}),
        lambda: tracker.log_table("t", ["a"], [[1]]),
        lambda: tracker.log_scatter("s", ["x", "y"], [[1, 2]], "x", "y", "t"),
        lambda: tracker.log_image("i", tmp_path / "none.png"),
        lambda: tracker.use_artifact("traces", "dataset", tmp_path),
        lambda: tracker.log_artifact("results", "eval", tmp_path),
        tracker.finish_run,
    ]
    assert [call() for call in calls] == [None] * len(calls)
    assert wandb.run is run_before and tracker.run_dirs == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["paper", "distill"])
def test_shipped_suites_load_and_their_overrides_fit_the_recipe(repo_root, name):
    from maps_train.recipe import load_recipe

    path = repo_root / "eval" / "suites" / f"{name}.yaml"
    suite = load_suite(path)
    assert [d.name for d in suite.datasets] == ["nq", "popqa", "2wikimultihopqa", "hotpotqa", "musique", "gpqa"]
    assert all(d.sample == 1000 and d.seed == 0 for d in suite.datasets[:5])
    assert suite.datasets[5].sample is None  # all 198 GPQA Diamond questions
    for system in suite.systems:
        load_recipe(None, system.overrides)  # every override names a real recipe field with a valid value
        recipe_file = repo_root / system.recipe
        if recipe_file.is_file():  # the recipes are written elsewhere; check them once they exist
            load_recipe(str(recipe_file), system.overrides)
    if name == "distill":
        assert {s.name: s.routes for s in suite.systems} == {
            "teacher_maps": "recipe", "student_maps_distilled": "distilled", "student_maps_prompted": "student_base",
            "teacher_vanilla_rag": "recipe", "student_vanilla_rag": "student_base", "student_search_o1": "student_base",
        }
    if name == "paper":
        methods = {s.name: load_recipe(None, s.overrides).agent for s in suite.systems}
        assert {a.method for a in methods.values()} == {"maps", "vanilla", "search_o1", "parallel_search", "s3"}
        assert methods["maps_no_parallelism.think"].num_directions == 1
        assert methods["maps_no_directions.think"].use_directions is False
        assert methods["maps_no_decoupling.nothink"].decoupled is False


def test_paper_suite_samples_realdata(repo_root, realdata):
    from maps_train.evaluate.suite import load_suite_questions

    path = repo_root / "eval" / "suites" / "paper.yaml"
    suite = load_suite(path, [f"data_root={realdata}"])
    questions = load_suite_questions(suite, suite.datasets[:5], path)
    assert {name: len(qs) for name, qs in questions.items()} == {
        "nq": 1000, "popqa": 764, "2wikimultihopqa": 128, "hotpotqa": 712, "musique": 220
    }
    again = load_suite_questions(suite, suite.datasets[:1], path)
    assert [q.id for q in again["nq"]] == [q.id for q in questions["nq"]]


def test_system_routes_teacher_student_and_adapters(repo_root, tmp_path, monkeypatch):
    from maps_train.evaluate.suite import SystemSpec, load_system_recipe

    recipe = repo_root / "recipes" / "distill" / "qwen3-4b.yaml"
    if not recipe.is_file():
        pytest.skip("recipes/distill/qwen3-4b.yaml not written yet")
    suite_path = tmp_path / "suite.yaml"
    teacher = load_system_recipe(SystemSpec("t", str(recipe)), 0, suite_path)
    student = load_system_recipe(SystemSpec("s", str(recipe), routes="student_base"), 0, suite_path)
    assert student.route("proposer").model == teacher.train.student != teacher.route("proposer").model
    assert student.route("answer").adapter is None
    adapters = [f"serve.adapters_dir={tmp_path / 'adapters'}"]
    with pytest.raises(ConfigError, match=r"systems\[0\] \(d\): adapter of role '.*' not found at .*adapters/"):
        load_system_recipe(SystemSpec("d", str(recipe), adapters, routes="distilled"), 0, suite_path)
    for name in teacher.sft_data.adapter_roles:
        (tmp_path / "adapters" / name).mkdir(parents=True)
    distilled = load_system_recipe(SystemSpec("d", str(recipe), adapters, routes="distilled"), 0, suite_path)
    assert distilled.route("proposer").adapter == str(tmp_path / "adapters" / "proposer")
    assert distilled.route("answer").adapter == str(tmp_path / "adapters" / "consolidator")  # answer rides consolidator
    assert distilled.route("writer").model == teacher.train.student


def test_names_of_systems_lying_close_together_are_stacked_not_overprinted():
    from maps_train.evaluate.plots import _label_offsets

    points = [(0.39, 20.0, "distilled"), (0.46, 20.0, "distilled_free"), (0.1, 40.0, "vanilla"), (0.97, 26.7, "base")]
    offsets = _label_offsets(points)
    assert offsets[0] == offsets[2] == offsets[3] == (4, 4)
    assert offsets[1][1] < offsets[0][1]  # the second name of the pair goes below the first


def test_runs_overlap_only_with_runs_on_the_same_engines():
    from maps_train.evaluate.suite import engines_of
    from maps_train.recipe import load_recipe

    teacher = load_recipe(None, ["roles.default.backend=vllm", "roles.default.model=m"])
    baseline = load_recipe(None, ["roles.default.backend=vllm", "roles.default.model=m", "agent.method=vanilla"])
    served = load_recipe(None, ["roles.default.backend=openai", "roles.default.model=m",
                                "backend.base_urls=[http://h:8000/v1]"])
    assert engines_of(teacher) == engines_of(baseline) == ("vllm:m",)
    assert engines_of(served) == ("openai@http://h:8000/v1",)


def test_suite_defaults_are_stated_once_and_a_system_s_own_fields_win(tmp_path):
    from maps_train.errors import ConfigError
    from maps_train.evaluate.suite import load_suite

    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: s\ndatasets: [{name: demo, path: data/demo/test.jsonl}]\n"
        "defaults: {recipe: recipes/demo/demo.yaml, overrides: [agent.top_k=5, agent.max_rounds=3], params_billion: 1.5}\n"
        "systems:\n"
        "  - {name: a}\n"
        "  - {name: b, overrides: [agent.max_rounds=1], params_billion: 0.1, recipe: recipes/demo/rl.yaml}\n")
    a, b = load_suite(suite).systems
    assert (a.recipe, a.overrides, a.params_billion) == ("recipes/demo/demo.yaml", ["agent.top_k=5", "agent.max_rounds=3"], 1.5)
    # b's own override comes last (so it wins over the default's max_rounds), and its own recipe and size stay.
    assert (b.recipe, b.overrides, b.params_billion) == ("recipes/demo/rl.yaml",
                                                        ["agent.top_k=5", "agent.max_rounds=3", "agent.max_rounds=1"], 0.1)
    suite.write_text("name: s\ndatasets: [{name: demo, path: data/demo/test.jsonl}]\nsystems: [{name: a}]\n")
    with pytest.raises(ConfigError, match=r"systems\[0\]\.recipe: missing \(and the suite's defaults name none\)"):
        load_suite(suite)


def test_the_shipped_suites_repeat_no_recipe_or_shared_override():
    from pathlib import Path

    from maps_train.evaluate.suite import load_suite

    for path in sorted(Path("eval/suites").glob("*.yaml")):
        raw = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        systems = load_suite(path).systems
        recipes = {system.recipe for system in systems}
        # a recipe that every system uses is named once (under defaults:), not once per system
        assert not (len(systems) > 1 and len(recipes) == 1 and raw.count(f"recipe: {recipes.pop()}") > 1), path


def test_a_system_replaces_one_distilled_adapter_and_keeps_the_others(tmp_path):
    """`adapters:` (routes distilled): an adapter trained after SFT (RL's) serves its roles; the rest stay the
    distilled ones; a name the recipe has no adapter of, or another kind of routes, is one line."""
    from maps_train.evaluate.suite import apply_routes
    from maps_train.recipe import load_recipe

    recipe = load_recipe("recipes/demo/demo.yaml", [f"train.output_dir={tmp_path / 'sft'}"])
    routed = apply_routes(recipe, "distilled", {"writer": str(tmp_path / "rl" / "writer")})
    assert routed.roles["writer"].adapter == str(tmp_path / "rl" / "writer")
    assert routed.roles["proposer"].adapter == str(tmp_path / "sft" / "proposer")
    assert routed.roles["consolidator"].adapter == routed.roles["default"].adapter == str(tmp_path / "sft" / "consolidator")
    plain = apply_routes(recipe, "distilled")
    assert {role: r for role, r in plain.roles.items() if role != "writer"} == {
        role: r for role, r in routed.roles.items() if role != "writer"}
    with pytest.raises(ConfigError, match=r"^adapters: critic: not an adapter of the recipe"):
        apply_routes(recipe, "distilled", {"critic": "x"})
    with pytest.raises(ConfigError, match=r"^adapters: .* only with routes: distilled \(not recipe\)$"):
        apply_routes(recipe, "recipe", {"writer": "x"})
