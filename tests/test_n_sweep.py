"""eval/suites/n_sweep.yaml: MAPS with N = 1..5 directions, run on the demo world in quick mode.

The suite file is loaded as shipped, then pointed at the demo world (the demo recipe, two demo test questions, a
temporary out_dir, no W&B), keeping each system's own overrides; the agent runs for real (`run_method`) on the
scripted backend and retriever doubles, so the test sees what reached the engine: each system's N in its proposer
schema and in its writer calls per round.
"""

from __future__ import annotations

from dataclasses import replace

from scripted_backend import RecordingRetriever, ScriptedBackend

from maps_train.agents.runner import run_method
from maps_train.config import dump_yaml
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

    def runner(recipe, questions, out_dir, progress=True):
        n = recipe.agent.num_directions
        backends[n] = ScriptedBackend()
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
    # Cover-EM and cost per N, for the plot of one against the other.
    for n in range(1, 6):
        cell = outcome.summary["cells"][f"maps_n{n}"]["Avg"]
        assert cell["n"] == 2 and cell["calls"] > 0 and cell["prompt_tokens"] > 0 and 0 <= cell["cover_em"] <= 1
    assert outcome.files.cost_plot.is_file()
