"""eval/suites/n_sweep.yaml: MAPS with N = 1..5 directions, run on the demo world in quick mode.

The suite file is loaded as shipped, then pointed at the demo world (the demo recipe, two demo test questions, a
temporary out_dir, no W&B), keeping each system's own overrides; the agent runs for real (`run_method`) on the
scripted backend and retriever doubles, so the test sees what reached the engine: each system's N in its proposer
schema and in its writer calls per round. The answer script gives the gold (in a sentence, upper-cased) to the first
N - 1 questions only, so each system's Cover-EM differs and is checked against FlashRAG's definition (the reference
in tests/test_cover_em_flashrag.py) applied to its answers.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend
from test_cover_em_flashrag import flashrag_acc

from maps_train.agents.runner import run_method
from maps_train.config.yaml_io import dump_yaml
from maps_train.evaluate.suite import DatasetSpec, load_suite, run_suite

SWEEP = "eval/suites/n_sweep.yaml"
DEMO_RECIPE = "recipes/demo/demo.yaml"


def demo_world_suite(repo_root, tmp_path):
    """The sweep as shipped, on the demo world: same systems and overrides, the demo recipe and 2 questions."""
    suite = load_suite(repo_root / SWEEP, ["wandb.enabled=false", f"out_dir={tmp_path / 'out'}"])
    suite.datasets = [DatasetSpec(name="demo", path=str(repo_root / "data/demo/test.jsonl"), sample=2, seed=0)]
    suite.systems = [replace(spec, recipe=str(repo_root / DEMO_RECIPE)) for spec in suite.systems]
    path = tmp_path / "n_sweep_demo.yaml"
    path.write_text(dump_yaml(suite), encoding="utf-8")
    return path


def test_the_sweep_runs_five_systems_and_each_n_reaches_the_engine(repo_root, tmp_path):
    shipped = load_suite(repo_root / SWEEP)
    assert [s.name for s in shipped.systems] == [f"maps_n{n}" for n in range(1, 6)]
    assert all(f"agent.num_directions={n}" in s.overrides for n, s in enumerate(shipped.systems, start=1))

    backends: dict[int, ScriptedBackend] = {}
    golds: dict[str, list[str]] = {}
    out_dirs: dict[int, str] = {}

    def runner(recipe, questions, out_dir, progress=True):
        n = recipe.agent.num_directions
        golds.update({q.id: q.golden_answers for q in questions})
        right = {q.id for q in questions[: n - 1]}  # N=1: none, N=2: the first, N>=3: both

        def answer(request, turn):
            gold = golds[request.question_id][0]
            return json.dumps({"answer": f"It was {gold.upper()}." if request.question_id in right else "unknown"})

        backends[n], out_dirs[n] = ScriptedBackend({"answer": answer}), out_dir
        return run_method(recipe, questions, out_dir, backend=backends[n], retriever=RecordingRetriever(),
                          progress=False)

    outcome = run_suite(demo_world_suite(repo_root, tmp_path), runner=runner, progress=False)
    assert outcome.scored == 5 * 2 and outcome.unanswered == 0
    assert outcome.summary["systems"] == [f"maps_n{n}" for n in range(1, 6)]
    assert sorted(backends) == [1, 2, 3, 4, 5]
    for n, backend in backends.items():
        proposals = backend.requests("proposer")
        assert proposals and all(r.json_schema["properties"]["directions"]["maxItems"] == n for r in proposals)
        # One writer call per direction per round: N sub-queries searched each round.
        writers_per_round = {len(batch) // 2 for batch in backend.batches if {r.role for r in batch} == {"writer"}}
        assert writers_per_round == {n}
    # Cover-EM and cost per N, for the plot of one against the other: Cover-EM is the reference's on the answers.
    for n in range(1, 6):
        cell = outcome.summary["cells"][f"maps_n{n}"]["Avg"]
        answers = [json.loads(line) for line in (Path(out_dirs[n]) / "answers.jsonl").read_text().splitlines()]
        expected = sum(flashrag_acc(a["answer"], golds[a["question_id"]]) for a in answers) / len(answers)
        assert expected == min(n - 1, 2) / 2  # the script did what it says
        assert cell["n"] == 2 and cell["calls"] > 0 and cell["prompt_tokens"] > 0
        assert cell["cover_em"] == pytest.approx(expected)
    assert outcome.files.cost_plot.is_file()
