"""Analyses from the agent's own runs: `retrieval_rounds` with one meaning for every method, the per-method trace
readers on traces the engines recorded (ScriptedBackend + RecordingRetriever, no model), gold evidence in every
metadata layout, the 3.3 drift on sequences whose accumulated change is known, and `maps-train analyze suite` on
a suite output that `run_suite` writes in the test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents.runner import run_method
from maps_train.analysis.drift import drift_curves, sample_keys
from maps_train.analysis.gold import gold_passages
from maps_train.analysis.runs import QuestionIndex, find_runs, run_sequences
from maps_train.analysis.stops import read_stop_rounds, stop_stats
from maps_train.analysis.trace_reader import searched_rounds
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.answer import AnswerRecord
from maps_train.records.trace import RoundRecord, SubQueryHits, TraceRecord

# -- scripted methods ------------------------------------------------------------------------------------------------

MAPS_VARIANTS = {  # system name -> recipe overrides (the ablations are switches of method `maps`)
    "maps": ["agent.method=maps"],
    "maps_no_directions": ["agent.method=maps", "agent.use_directions=false"],
    "maps_no_parallelism": ["agent.method=maps", "agent.num_directions=1"],
    "maps_no_decoupling": ["agent.method=maps", "agent.decoupled=false"],
}
BASELINES = {name: [f"agent.method={name}"] for name in ("search_o1", "parallel_search", "s3", "vanilla")}
SYSTEMS = {**MAPS_VARIANTS, **BASELINES}


def searches_of(question_id: str) -> int:
    """How many searches (MAPS: rounds) the scripts make for a question: 2 or 3."""
    return 2 + int(question_id[-1]) % 2


def o1_reasoner(queries):
    """Search-o1 turns: each writes the next of `queries(question_id)` (the backend stops before the end
    marker), then the boxed answer."""

    def script(request, turn):
        wanted = queries(request.question_id)
        if turn < len(wanted):
            return f"Step {turn}: I need a fact.\n<|begin_search_query|>{wanted[turn]}"
        return "So it is Dijon. \\boxed{Dijon}"

    return script


def o1_condenser(request, turn):
    return "**Final Information**\n\nEiffel was born in Dijon."


def parallel_reasoner(request, turn):
    qid = request.question_id
    if turn < searches_of(qid):
        return f"<think>more</think>\n<search> Eiffel birthplace {turn} {qid} ## Dijon region {turn} {qid} "
    return "<answer> Dijon "


def s3_searcher(request, turn):
    qid = request.question_id
    if turn < searches_of(qid) - 1:  # the engine's initial retrieval is the first search
        return f'<important_info>[1]</important_info>\n<query>\n{{"query": "Gustave Eiffel born {turn} {qid}"}}\n'
    return "<search_complete>True</search_complete>"


def scripts_for(method: str, maps_rounds=None) -> dict:
    if method == "maps":
        return {"consolidator": consolidator_sufficient_after(maps_rounds or {})}
    return {
        "search_o1": {"reasoner": o1_reasoner(lambda q: [f"Eiffel fact {t} {q}" for t in range(searches_of(q))]),
                      "condenser": o1_condenser},
        "parallel_search": {"reasoner": parallel_reasoner},
        "s3": {"searcher": s3_searcher, "generator": lambda r, t: "Dijon"},
        "vanilla": {"generator": lambda r, t: "Dijon"},
    }[method]


def toy_questions(prefix: str, n: int, dataset: str = "toy") -> list[Question]:
    return [
        Question(id=f"{prefix}{i}", question=f"Where was the engineer of the Eiffel Tower {prefix}{i} born?",
                 golden_answers=["Dijon"], dataset=dataset)
        for i in range(n)
    ]


def run(tmp_path, overrides, scripts, qs):
    recipe = load_recipe(None, [*overrides, "agent.top_k=2", "agent.batch_size=4"])
    records = run_method(recipe, qs, tmp_path, backend=ScriptedBackend(scripts), retriever=RecordingRetriever(),
                         progress=False)
    traces = [TraceRecord.from_dict(json.loads(line)) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    return records, {t.question_id: t for t in traces}


# -- retrieval_rounds ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("system", sorted(MAPS_VARIANTS))
def test_maps_and_ablations_count_one_retrieval_round_per_round(tmp_path, system):
    qs = toy_questions("q", 3)
    stop_at = {"q0": 1, "q1": 2, "q2": 3}  # one batch: each question leaves it at its own round
    records, traces = run(tmp_path, MAPS_VARIANTS[system], scripts_for("maps", stop_at), qs)
    assert [r.retrieval_rounds for r in records] == [1, 2, 3] == [r.rounds for r in records]
    assert [traces[q.id].retrieval_rounds for q in qs] == [1, 2, 3]


def test_baselines_count_executed_searches_only(tmp_path):
    # vanilla: its one retrieval.
    records, _ = run(tmp_path / "v", BASELINES["vanilla"], scripts_for("vanilla"), toy_questions("v", 2))
    assert [(r.retrieval_rounds, r.rounds) for r in records] == [(1, 1), (1, 1)]
    # search_o1: "A", "A" again (refused: no search), "B", then the answer: 2 retrieval rounds in 4 turns; a
    # question that answers at once: 0 retrieval rounds.
    queries = {"o0": ["A fact", "A fact", "B fact"], "o1": []}
    scripts = {"reasoner": o1_reasoner(lambda q: queries[q]), "condenser": o1_condenser}
    records, traces = run(tmp_path / "o", BASELINES["search_o1"], scripts, toy_questions("o", 2))
    assert [(r.retrieval_rounds, r.rounds) for r in records] == [(2, 4), (0, 1)]
    assert records[1].cost.retrievals == 0
    # parallel_search: 2 or 3 search calls of two sub-queries each, then the answer turn.
    records, _ = run(tmp_path / "p", BASELINES["parallel_search"], scripts_for("parallel_search"), toy_questions("p", 2))
    assert [(r.retrieval_rounds, r.rounds) for r in records] == [(2, 3), (3, 4)]
    # s3: the initial retrieval plus one or two searcher queries; its rounds also count the completing step.
    records, _ = run(tmp_path / "s", BASELINES["s3"], scripts_for("s3"), toy_questions("s", 2))
    assert [(r.retrieval_rounds, r.rounds) for r in records] == [(2, 3), (3, 4)]


def test_retrieval_rounds_round_trip_and_old_records():
    record = AnswerRecord("q1", "Dijon", rounds=4, retrieval_rounds=2)
    assert record.to_dict()["retrieval_rounds"] == 2 and AnswerRecord.from_dict(record.to_dict()) == record
    assert AnswerRecord.from_dict({"question_id": "q1", "answer": "x", "rounds": 3}).retrieval_rounds is None
    with pytest.raises(Exception, match="'retrieval_rounds' must be int"):
        AnswerRecord.from_dict({"question_id": "q1", "answer": "x", "retrieval_rounds": "2"})
    trace = TraceRecord("q1", "Q?", "toy", "maps", "d", [], "sufficient", None, "x", retrieval_rounds=2)
    assert TraceRecord.from_dict(trace.to_dict()).retrieval_rounds == 2
    old = trace.to_dict()
    del old["retrieval_rounds"]
    assert TraceRecord.from_dict(old).retrieval_rounds is None


# -- trace readers ---------------------------------------------------------------------------------------------------


def test_each_methods_reader_returns_the_searched_rounds(tmp_path):
    qs = toy_questions("r", 2)
    for system, overrides in SYSTEMS.items():
        method = "maps" if system in MAPS_VARIANTS else system
        _, traces = run(tmp_path / system, overrides, scripts_for(method, {"r0": 2, "r1": 3}), qs)
        for qid, trace in traces.items():
            written = searched_rounds(trace)
            every = searched_rounds(trace, include_question_searches=True)
            assert len(every) == trace.retrieval_rounds, system  # the reader and the counter agree
            if method == "maps":
                assert written == [r.sub_queries for r in trace.rounds] and len(written) == searches_of(qid)
                width = 1 if system == "maps_no_parallelism" else 3
                assert {len(r) for r in written} == {width}
            elif method == "search_o1":
                assert written == [[f"Eiffel fact {t} {qid}"] for t in range(searches_of(qid))]
            elif method == "parallel_search":
                assert written == [[f"Eiffel birthplace {t} {qid}", f"Dijon region {t} {qid}"]
                                   for t in range(searches_of(qid))]
            elif method == "s3":  # the initial retrieval searched the question itself
                assert every[0] == [trace.question] and written == every[1:] and len(written) == searches_of(qid) - 1
            else:
                assert written == [] and every == [[trace.question]]


def test_refused_search_o1_turns_are_not_searched_rounds(tmp_path):
    scripts = {"reasoner": o1_reasoner(lambda q: ["A fact", "A fact", "B fact"]), "condenser": o1_condenser}
    _, traces = run(tmp_path, BASELINES["search_o1"], scripts, toy_questions("o", 1))
    trace = traces["o0"]
    assert [r.sub_queries for r in trace.rounds][:3] == [["A fact"], ["A fact"], ["B fact"]]  # what it wrote
    assert searched_rounds(trace) == [["A fact"], ["B fact"]]  # what reached the retriever


def test_an_unknown_method_is_read_by_the_shared_rule():
    rounds = [
        RoundRecord(1, sub_queries=["a", "b"], retrieved=[SubQueryHits("a", ["p1"]), SubQueryHits("b", [])]),
        RoundRecord(2, sub_queries=["refused"]),  # wrote a query, searched nothing
        RoundRecord(3, sub_queries=["c"], retrieved=[SubQueryHits("c", ["p2"])]),
    ]
    trace = TraceRecord("x", "Q?", "toy", "new_method", "d", rounds, "done", None, "")
    assert searched_rounds(trace) == [["a", "b"], ["c"]]


# -- gold evidence ---------------------------------------------------------------------------------------------------


def test_gold_passages_in_every_layout():
    realdata = {"supporting_paragraphs": [{"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "c1"}]}
    assert gold_passages(realdata) == ["Dijon\nDijon is in Burgundy."]
    musique = {"paragraphs": [{"idx": 0, "title": "A", "paragraph_text": "a text", "is_supporting": False},
                              {"idx": 1, "title": "B", "paragraph_text": "b  text", "is_supporting": True}]}
    assert gold_passages(musique) == ["B\nb text"]
    hotpot = {"supporting_facts": {"title": ["B", "B", "C"], "sent_id": [0, 1, 0]},
              "context": {"title": ["A", "B", "C"], "sentences": [["a."], ["b1.", "b2."], ["c."]]}}
    assert gold_passages(hotpot) == ["B\nb1. b2.", "C\nc."]
    two_wiki = {"supporting_facts": [["C", 0]], "context": [["A", ["a."]], ["C", ["c1.", "c2."]]]}
    assert gold_passages(two_wiki) == ["C\nc1. c2."]
    flashrag_2wiki = {"supporting_facts": {"title": ["A"], "sent_id": [0]},
                      "context": {"title": ["A"], "content": [["a1.", "a2."]]}}
    assert gold_passages(flashrag_2wiki) == ["A\na1. a2."]
    demo = {"supporting_paragraphs": [{"corpus_id": "demo-1", "title": "X"}]}
    assert gold_passages(demo) == [] and gold_passages(demo, {"demo-1": "X\nx text"}) == ["X\nx text"]
    assert gold_passages({"hops": 2}) == [] and gold_passages(None) == []


def test_real_metadata_gives_gold_passages(realdata):
    for name, split in (("hotpotqa", "dev"), ("2wikimultihopqa", "dev"), ("musique", "dev"), ("popqa", "test")):
        row = json.loads((realdata / name / f"{split}.jsonl").open().readline())
        assert gold_passages(row["metadata"]), name


# -- drift (3.3) -----------------------------------------------------------------------------------------------------


def test_drift_accumulates_the_change_of_cos_m_q0():
    # One sub-query per round, taken as is (`first`; `mean` would re-normalise). β = 0: m_t = q_t - q_{t-1}.
    q0 = np.array([1.0, 0.0])
    points = [np.array([1.0, 1.0]), np.array([2.0, 1.0]), np.array([2.0, 0.0])]
    rounds = [[p[None, :] for p in points]]
    # m_1 = (0,1): cos 0; m_2 = (1,0): cos 1; m_3 = (0,-1): cos 0.
    curves = drift_curves("hand", [q0], rounds, betas=0.0, step_query="first")
    assert [c.drift for c in curves] == pytest.approx([0.0, 1.0, 0.0])
    assert [c.abs_drift for c in curves] == pytest.approx([0.0, 1.0, 2.0])
    # β = 0.5 (m_0 = 0): m_1 = (0,0.5): cos 0; m_2 = 0.5 m_1 + 0.5 (1,0) = (0.5,0.25): cos = 0.5/√0.3125;
    # m_3 = 0.5 m_2 + 0.5 (0,-1) = (0.25,-0.375): cos = 0.25/√0.203125.
    curves = drift_curves("hand", [q0], rounds, betas=0.5, step_query="first")
    c2, c3 = 0.5 / math.sqrt(0.3125), 0.25 / math.sqrt(0.203125)
    assert [c.drift for c in curves] == pytest.approx([0.0, c2, c3])
    assert [c.abs_drift for c in curves] == pytest.approx([0.0, c2, c2 + abs(c3 - c2)])


def test_drift_averages_over_the_questions_that_reach_each_round():
    q0 = np.array([1.0, 0.0])
    away = [np.array([[1.0, 1.0]]), np.array([[1.0, 2.0]])]  # m_1 = (0,1) cos 0, m_2 = (0,1) cos 0: no drift
    back = [np.array([[1.0, 1.0]]), np.array([[2.0, 1.0]]), np.array([[2.0, 0.0]])]  # drift 0, 1, 0
    evidence = [np.array([[0.0, 1.0]]), np.zeros((0, 2))]
    curves = drift_curves("m", [q0, q0], [away, back], evidence, betas=0.0, step_query="first")
    assert [c.n for c in curves] == [2, 2, 1]
    assert [c.drift for c in curves] == pytest.approx([0.0, 0.5, 0.0])
    # Evidence similarity only where gold is known (question 1): max cos of the raw round vectors to (0,1).
    assert [c.n_evidence for c in curves] == [1, 1, 0]
    assert curves[0].evidence_similarity == pytest.approx(1.0) and math.isnan(curves[2].evidence_similarity)


def test_drift_sample_is_seeded_and_shared():
    keys = [("hotpotqa", str(i)) for i in range(700)] + [("musique", str(i)) for i in range(300)]
    first = sample_keys(keys, 500, seed=0)
    assert len(first) == 500 and first == sample_keys(reversed(keys), 500, seed=0)
    assert first != sample_keys(keys, 500, seed=1) and {d for d, _ in first} == {"hotpotqa", "musique"}
    assert sample_keys(keys[:10], 500) == set(keys[:10])


# -- run folders, suites, `maps-train analyze suite` -----------------------------------------------------------------

DATASETS = ("hotpotqa", "musique")


def write_questions(data_root, name: str, prefix: str, n: int) -> None:
    """Realdata layout for hotpotqa (supporting_paragraphs), FlashRAG's MuSiQue layout for musique."""
    rows = []
    for i in range(n):
        qid = f"{prefix}{i}"
        if name == "hotpotqa":
            metadata = {"supporting_paragraphs": [{"title": "Gustave Eiffel", "text": f"Eiffel {qid} was born in Dijon."}]}
        else:
            metadata = {"paragraphs": [{"title": "Dijon", "paragraph_text": f"Dijon {qid} is in Burgundy.",
                                        "is_supporting": True}]}
        rows.append({"id": qid, "question": f"Where was the engineer of the Eiffel Tower {qid} born?",
                     "golden_answers": ["Dijon"], "metadata": metadata})
    (data_root / name).mkdir(parents=True)
    (data_root / name / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def scripted_runner(recipe, questions, out_dir, progress=True):
    """The real engines and runner, with scripted role outputs and the word-overlap retriever."""
    method = recipe.agent.method
    stop_at = {q.id: searches_of(q.id) for q in questions}
    backend = ScriptedBackend(scripts_for(method, stop_at))
    return run_method(recipe, questions, out_dir, backend=backend, retriever=RecordingRetriever(), progress=False)


@pytest.fixture(scope="module")
def suite_out(tmp_path_factory):
    from maps_train.evaluate.suite import run_suite
    from maps_train.tracking import Tracker

    root = tmp_path_factory.mktemp("suite")
    for name, prefix in zip(DATASETS, ("hp", "mu")):
        write_questions(root / "data", name, prefix, 8)
    recipe = root / "recipe.yaml"
    recipe.write_text("name: scripted\nroles:\n  default:\n    model: Qwen/Qwen3-32B\n")
    systems = "".join(
        f"  - {{name: {name}, recipe: {recipe}, overrides: [{', '.join(o)}], params_billion: 32.8}}\n"
        for name, o in SYSTEMS.items()
    )
    suite = root / "suite.yaml"
    suite.write_text(
        f"name: scripted\nout_dir: {root / 'out'}\ndata_root: {root / 'data'}\n"
        "datasets:\n  - {name: hotpotqa, sample: 6, seed: 0}\n  - {name: musique, sample: 6, seed: 0}\n"
        f"systems:\n{systems}wandb: {{enabled: false}}\n"
    )
    run_suite(suite, runner=scripted_runner, tracker=Tracker(), progress=False)
    return root / "out"


def test_run_folders_and_gold_are_found_from_the_suite_output(suite_out):
    runs = find_runs(suite_out)
    assert {r.system for r in runs} == set(SYSTEMS) and {r.dataset for r in runs} == set(DATASETS)
    assert all(r.suite_root == suite_out for r in runs)
    one = suite_out / "runs" / "search_o1" / "musique"
    assert find_runs(one) == [r for r in runs if r.path == one]
    assert {r.dataset for r in find_runs(suite_out / "runs" / "maps")} == set(DATASETS)
    sequences = run_sequences([r for r in runs if r.system == "search_o1"], QuestionIndex())
    chosen = sequences["search_o1"]
    assert len(chosen) == 12 and all(len(s.evidence) == 1 for s in chosen)
    assert {s.dataset for s in chosen} == set(DATASETS)
    assert any("is in Burgundy" in s.evidence[0] for s in chosen)  # MuSiQue's is_supporting paragraph


def test_stops_read_retrieval_rounds_and_fall_back_to_rounds(tmp_path, suite_out):
    rounds = read_stop_rounds(suite_out / "runs" / "search_o1" / "hotpotqa" / "answers.jsonl")
    assert all(not r.fallback and r.rounds in (2, 3) for r in rounds)
    old = tmp_path / "old.jsonl"
    old.write_text('{"question_id": "a", "rounds": 1}\n{"question_id": "b", "rounds": 6, "retrieval_rounds": 5}\n')
    stats = stop_stats("old", read_stop_rounds(old))
    assert stats.n_fallback == 1 and stats.share_round_1 == 0.5 and stats.share_round_5_plus == 0.5
    assert stats.source == "retrieval_rounds; rounds for 1 old records"


def test_analyze_suite_cli_writes_every_table_and_plot(suite_out, minilm, tmp_path):
    from typer.testing import CliRunner

    from maps_train.cli import app

    out = tmp_path / "analysis"
    result = CliRunner().invoke(app, ["analyze", "suite", str(suite_out), "--encoder", minilm, "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("momentum", "drift", "stops"):
        assert (out / name / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / name / f"{name}.csv").stat().st_size > 0
    momentum = (out / "momentum" / "momentum.md").read_text()
    drift = (out / "drift" / "drift.md").read_text()
    stops = (out / "stops" / "stops.md").read_text()
    for system in set(SYSTEMS) - {"vanilla"}:
        # s3 writes one sub-query fewer (its first retrieval is the question), so its table stops at step 1.
        assert f"| {system} | {1 if system == 's3' else 2} |" in momentum and f"| {system} | 2 |" in drift, system
    assert "| all (pooled) | 1 | 0.0000 (not identified) |" in momentum
    assert "vanilla: no fit" in momentum  # its one retrieval is the question itself
    assert "12 questions drawn at random (seed 0) across 2 data sets (hotpotqa, musique)" in drift
    assert "No searched sub-query of their own on these questions: vanilla." in drift
    for system in SYSTEMS:
        assert f"| {system} | 12 |" in stops
    assert "| vanilla | 12 | 1.00 | 100.0% |" in stops
    answers = [json.loads(line) for d in DATASETS
               for line in (suite_out / "runs" / "s3" / d / "answers.jsonl").read_text().splitlines()]
    mean = sum(a["retrieval_rounds"] for a in answers) / 12
    assert f"| s3 | 12 | {mean:.2f} | 0.0% | 0.0% | 0.0% | retrieval_rounds |" in stops
    page = (out / "analysis.md").read_text()
    assert "## Table 1: search momentum per data set, on Search-o1" in page and "Stop rounds (3.4)" in page
    assert "| HotpotQA | search_o1 | 1 |" in page and "## Search momentum per system and pooled (this project's" in page
    rows = list((out / "drift" / "drift.csv").read_text().splitlines())
    assert rows[0].startswith("method,round,n,drift,abs_drift,evidence_similarity,n_evidence")
    # Gold evidence came from the suite's data sets, looked up by question id: every round has a similarity.
    assert all(row.split(",")[6] != "0" for row in rows[1:])


def test_analyze_suite_logs_tables_and_plots_to_the_tracker(suite_out, minilm, tmp_path):
    from maps_train.analysis.embed import TextEncoder
    from maps_train.analysis.suite import SuiteAnalysisOptions, analyze_suite
    from maps_train.tracking import Tracker

    class Recording(Tracker):
        def __init__(self):
            super().__init__()
            self.logged = []

        def log_table(self, key, columns, rows):
            self.logged.append(("table", key, len(rows)))

        def log_image(self, key, path):
            self.logged.append(("image", key, path.stat().st_size > 0))

    tracker = Recording()
    options = SuiteAnalysisOptions(encoder=minilm, drift_questions=5, drift_beta=0.3)
    result = analyze_suite(suite_out / "runs" / "maps", tmp_path, options, TextEncoder(minilm), tracker=tracker)
    assert [s.name for s in result.sections] == ["momentum", "drift", "stops", "evidence"]
    assert {(kind, key) for kind, key, _ in tracker.logged} == {
        ("table", "momentum"), ("table", "drift"), ("table", "stops"), ("table", "evidence"),
        ("image", "momentum_plot"), ("image", "drift_plot"), ("image", "stops_plot"), ("image", "evidence_plot"),
    }
    assert "5 questions drawn" in result.sections[1].markdown and "β = 0.3" in result.sections[1].markdown


def test_a_run_without_sub_queries_still_gets_its_tables(suite_out, minilm, tmp_path):
    from maps_train.analysis.embed import TextEncoder
    from maps_train.analysis.suite import SuiteAnalysisOptions, analyze_suite

    options = SuiteAnalysisOptions(encoder=minilm)
    result = analyze_suite(suite_out / "runs" / "vanilla", tmp_path, options, TextEncoder(minilm))
    momentum, drift, stops, _ = (s.markdown for s in result.sections)
    assert "vanilla: no fit" in momentum and "of their own on these questions: vanilla" in drift
    assert "| vanilla | 12 | 1.00 | 100.0% |" in stops
    assert all(s.plot.stat().st_size > 0 for s in result.sections)


def test_a_plain_run_folder_takes_gold_from_given_question_files(tmp_path):
    from maps_train.analysis.inputs import parse_sources, sequences_by_method

    qs = toy_questions("g", 2)
    run(tmp_path / "runs" / "mine", MAPS_VARIANTS["maps"], scripts_for("maps", {"g0": 2, "g1": 2}), qs)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": q.id, "question": q.question, "metadata": {
        "supporting_paragraphs": [{"title": "Dijon", "text": f"Dijon {q.id}."}]}}) + "\n" for q in qs))
    sources = parse_sources([f"maps={tmp_path / 'runs' / 'mine'}"])
    (sequences,) = sequences_by_method(sources, QuestionIndex([questions])).values()
    assert [s.evidence for s in sequences] == [["Dijon\nDijon g0."], ["Dijon\nDijon g1."]]
    assert [len(s.rounds) for s in sequences] == [2, 2]
    # Without the file there is no gold, and the sequences are still read.
    (bare,) = sequences_by_method([(None, tmp_path / "runs" / "mine" / "traces.jsonl")]).values()
    assert [s.evidence for s in bare] == [[], []] and [s.rounds for s in bare] == [s.rounds for s in sequences]
    # `analyze momentum traces.jsonl` reads it as traces (it used to fail: "field 'subqueries' holds dict").
    from maps_train.analysis.sequences import load_sequences

    direct = load_sequences(tmp_path / "runs" / "mine" / "traces.jsonl")
    assert [s.rounds for s in direct] == [s.rounds for s in sequences]


def test_a_suite_data_root_relative_to_where_eval_ran(tmp_path, monkeypatch):
    from maps_train.analysis.runs import suite_dataset_files

    write_questions(tmp_path / "data", "musique", "mu", 2)
    (tmp_path / "data" / "musique" / "train.jsonl").write_text("")
    out = tmp_path / "runs" / "eval" / "x"
    out.mkdir(parents=True)
    (out / "suite.yaml").write_text("name: x\ndata_root: data\ndatasets:\n  - {name: musique}\n")
    monkeypatch.chdir(out)  # not where eval ran: the suite folder's parents are tried
    files = suite_dataset_files(out)
    assert files["musique"][0] == tmp_path / "data" / "musique" / "dev.jsonl"  # dev before other splits
    assert suite_dataset_files(out, tmp_path / "elsewhere") == {"musique": []}
