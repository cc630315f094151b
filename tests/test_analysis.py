"""Momentum, drift and stop-round analyses: hand-worked values, β recovery, and real MiniLM runs on MuSiQue."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from maps_train.analysis.drift import drift_curves
from maps_train.analysis.momentum import (
    MomentumOptions,
    Trajectories,
    fit_betas,
    momentum_table,
    step_scores,
    trajectories_from_rounds,
)
from maps_train.analysis.sequences import load_sequences, sequences_from_pairs
from maps_train.analysis.stops import load_stop_rounds, stop_stats
from maps_train.errors import MapsTrainError


def _traj(points: list[list[list[float]]]) -> Trajectories:
    """Equal-length paths given as lists of points q_0..q_T."""
    array = np.array(points, dtype=float)
    n = len(points)
    return Trajectories([str(i) for i in range(n)], array, np.full(n, array.shape[1] - 1), np.ones(n))


# q_0=(1,0), q_1=(1,1), q_2=(0,1), q_3=(0,2); worked by hand in the comments below.
HAND = [[[1, 0], [1, 1], [0, 1], [0, 2]]]


def test_s_t_hand_worked_zero_m0():
    # m_1 = 0.5*0 + 0.5*(0,1) = (0,0.5);  S_1 = cos((0,0.5), q_2-q_0=(-1,1)) = 1/sqrt(2)
    # m_2 = 0.5*(0,0.5) + 0.5*(q_2-q_1=(-1,0)) = (-0.5,0.25);  S_2 = cos(m_2, q_3-q_0=(-1,2)) = 1/1.25 = 0.8
    scores = step_scores(_traj(HAND), [0.5, 0.5], "zero")
    assert scores[0] == (1, pytest.approx(1 / math.sqrt(2)))
    assert scores[1] == (1, pytest.approx(0.8))


def test_s_t_hand_worked_question_m0():
    # m_0 = q_0 = (1,0); m_1 = (0.5,0.5): S_1 = cos((0.5,0.5), (-1,1)) = 0
    # m_2 = 0.5*(0.5,0.5) + 0.5*(-1,0) = (-0.25,0.25): S_2 = 0.75 / (0.25*sqrt(2)*sqrt(5)) = 3/sqrt(10)
    scores = step_scores(_traj(HAND), [0.5, 0.5], "question")
    assert scores[0][1] == pytest.approx(0.0, abs=1e-12)
    assert scores[1][1] == pytest.approx(3 / math.sqrt(10))


def generate_momentum_process(n, betas, m0="zero", noise=0.5, dim=16, seed=0) -> Trajectories:
    """Sequences whose next displacement follows the momentum: q_{t+1} - q_0 = m_t + noise·|m_t|·u_t.

    u_t is isotropic and drawn after m_t, so the unit targets average to a vector parallel to m_t: mean S_t is
    x·E[unit target] for the fitted direction x, maximised when x ∥ m_t, i.e. at the true β_t (given the
    earlier β's). The noise adds variance, not bias. q_1 - q_0 is free (a random first move).
    """
    rng = np.random.default_rng(seed)
    steps = len(betas) + 1
    points = np.zeros((n, steps + 1, dim))
    for i in range(n):
        q0 = rng.normal(size=dim)
        qs = [q0, q0 + rng.normal(size=dim)]
        m = {"zero": np.zeros(dim), "question": q0.copy(), "first-step": qs[1] - q0}[m0]
        for t, beta in enumerate(betas, start=1):
            m = beta * m + (1 - beta) * (qs[t] - qs[t - 1])
            qs.append(q0 + m + noise * np.linalg.norm(m) * rng.normal(size=dim) / math.sqrt(dim))
        points[i] = np.stack(qs)
    return Trajectories([f"q{i}" for i in range(n)], points, np.full(n, steps), np.ones(n))


def test_beta_recovered_with_beta_1_zero():
    # Under m_0 = 0, S_1 does not depend on β_1: the fit fixes it at 0 (m_1 = q_1 - q_0, the paper's β_1 = 0)
    # and says so; the later β_t are recovered on that convention.
    true = [0.0, 0.2, 0.7, 0.4]
    betas, identified = fit_betas(generate_momentum_process(300, true), MomentumOptions(m0="zero"))
    assert identified == [False, True, True, True]
    assert betas[0] == 0.0
    assert betas[1:] == pytest.approx(true[1:], abs=0.03)
    joint, _ = fit_betas(generate_momentum_process(300, true), MomentumOptions(m0="zero", fit="joint"))
    assert joint[0] == 0.0 and joint[1:] == pytest.approx(true[1:], abs=0.04)  # the joint fit leaves β_1 alone


def test_beta_1_convention_is_a_rescaling_the_later_betas_absorb():
    # Data made with β_1 = 0.5 (m_1 = 0.5 d_1): the old convention (beta_init = 0.5) recovers the generator, the
    # paper's (β_1 = 0, m_1 = d_1) gives the β that point m_t the same way. Closed form with d_t = q_t - q_{t-1}:
    # m_2 ∝ 0.1 d_1 + 0.8 d_2 needs b_2/(1-b_2) = 0.1/0.8, b_2 = 1/9, and then m_2 is 10/9 of the true one, so
    # b_3 (10/9) / (1-b_3) = 0.7/0.3, b_3 = 21/31.
    true = [0.5, 0.2, 0.7]
    traj = generate_momentum_process(400, true, seed=4)
    old, _ = fit_betas(traj, MomentumOptions(m0="zero", beta_init=0.5))
    assert old == pytest.approx(true, abs=0.03)
    paper, _ = fit_betas(traj, MomentumOptions(m0="zero"))
    assert paper == pytest.approx([0.0, 1 / 9, 21 / 31], abs=0.03)
    table = momentum_table(traj, MomentumOptions(m0="zero"))
    assert "0.0000 (not identified)" in table.to_markdown() and "fixed at beta_init = 0.0" in table.to_markdown()


def test_beta_recovered_question_m0_every_step():
    true = [0.3, 0.6, 0.85]
    betas, identified = fit_betas(
        generate_momentum_process(300, true, m0="question", seed=1), MomentumOptions(m0="question")
    )
    assert all(identified)
    assert betas == pytest.approx(true, abs=0.03)


def test_joint_fit_matches_truth():
    true = [0.3, 0.6, 0.85]
    traj = generate_momentum_process(300, true, m0="question", seed=2)
    betas, _ = fit_betas(traj, MomentumOptions(m0="question", fit="joint"))
    assert betas == pytest.approx(true, abs=0.04)


def test_fit_respects_bounds():
    rng = np.random.default_rng(0)
    q0s, q1s = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    # Target q_2 - q_0 = (q_1 - q_0) - q_0: parallel to m_1 = β q_0 + (1-β)(q_1-q_0) only at β/(1-β) = -1,
    # outside [0, 1]; the bounded optimum is the edge β = 0.
    below = _traj([[a, b, a + (b - a) - a] for a, b in zip(q0s, q1s)])
    beta, _ = fit_betas(below, MomentumOptions(m0="question"))
    assert beta == [0.0]
    # Target parallel to q_0 itself: β = 1 (m_1 = q_0) is best, at the upper bound.
    above = _traj([[a, b, a + 2 * a] for a, b in zip(q0s, q1s)])
    beta, _ = fit_betas(above, MomentumOptions(m0="question"))
    assert 0.999 <= beta[0] <= 1.0


def test_held_out_below_train_on_average():
    # E[S_train(β̂)] >= E[S_train(β*)] = E[S_test(β*)] >= E[S_test(β̂)]: fitting on few sequences is optimistic.
    gaps = []
    for seed in range(40):
        traj = generate_momentum_process(16, [0.5, 0.3, 0.7], m0="question", noise=3.0, seed=100 + seed)
        table = momentum_table(traj, MomentumOptions(m0="question", seed=seed))
        gaps += [s.s_train - s.s_test for s in table.steps]
    assert np.mean(gaps) > 0


def test_unequal_lengths_counted_per_step():
    # Three questions with 1, 2 and 3 steps: only sequences with q_{t+1} score step t.
    dim = 4
    rng = np.random.default_rng(3)
    rounds = [[rng.normal(size=(1, dim)) for _ in range(k)] for k in (1, 2, 3)]
    traj = trajectories_from_rounds(["a", "b", "c"], list(rng.normal(size=(3, dim))), rounds)
    scores = step_scores(traj, [0.5, 0.5], "zero")
    assert [n for n, _ in scores] == [2, 1]


def test_step_query_options():
    q0 = np.array([1.0, 0.0, 0.0])
    round1 = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    round2 = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    first = trajectories_from_rounds(["x"], [q0], [[round1, round2]], "first")
    assert first.points[0, 1] == pytest.approx(round1[0])
    mean = trajectories_from_rounds(["x"], [q0], [[round1, round2]], "mean")
    assert mean.points[0, 1] == pytest.approx(np.array([0, 1, 1]) / math.sqrt(2))
    paths = trajectories_from_rounds(["x"], [q0], [[round1, round2]], "paths")
    assert len(paths.question_ids) == 6 and paths.weights.sum() == pytest.approx(1.0)
    capped = trajectories_from_rounds(["x"], [q0], [[round1, round2]], "paths", max_paths=4)
    assert len(capped.question_ids) == 4 and capped.weights.sum() == pytest.approx(1.0)


def test_musique_loader_references_and_relations(realdata):
    path = realdata / "musique" / "dev.jsonl"
    kept = load_sequences(path)
    assert len(kept) == 220 and {len(s.rounds) for s in kept} == {2, 3, 4}
    first = kept[0]
    assert first.rounds[1] == ["#1 >> capital"] and len(first.evidence) == 2
    answered = load_sequences(path, references="answer", relations="rewrite")[0]
    assert answered.rounds[1] == ["the capital of Mountrail County"]


def test_bad_input_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "question": "q", "subqueries": ["x", "y"]}\n{"id": "b", "subqueries": []}\n')
    with pytest.raises(MapsTrainError, match=r"bad.jsonl:2: missing field 'question'"):
        load_sequences(path)
    path.write_text('{"id": "a", "question": "q", "subqueries": [3]}\n')
    with pytest.raises(MapsTrainError, match=r"bad.jsonl:1: field 'subqueries'"):
        load_sequences(path)


@pytest.fixture(scope="session")
def minilm_encoder(minilm):
    from maps_train.analysis.embed import TextEncoder

    return TextEncoder(minilm)


def test_momentum_table_on_musique_with_minilm(realdata, minilm_encoder):
    from maps_train.analysis.momentum import analyze_momentum

    sequences = load_sequences(realdata / "musique" / "dev.jsonl")
    table = analyze_momentum(sequences, minilm_encoder, MomentumOptions())
    assert [s.step for s in table.steps] == [1, 2, 3]
    # 2-4 hop questions: every question scores step 1, the 3- and 4-hop ones step 2, the 4-hop ones step 3.
    assert sum(s.n_train + s.n_test for s in table.steps) == 220 + 81 + 25
    assert all(0.0 <= s.beta <= 1.0 for s in table.steps)
    assert not table.steps[0].identified and table.steps[1].identified
    # Momentum helps where there is history to carry: fitted β beats β = 0 on held-out step 2.
    assert table.steps[1].s_test > table.steps[1].s_test_no_momentum
    assert "m0" in table.to_markdown() and table.to_csv().startswith("step,beta")


def test_trace_pairs_with_parallel_rounds(minilm_encoder):
    from maps_train.analysis.momentum import analyze_momentum

    def traces():
        yield (
            "Which river flows through the capital of Norway?",
            [["capital of Norway", "Norway capital city"], ["river through Oslo", "Akerselva"], ["Oslo rivers list"]],
        )
        yield (
            "Who founded the company that makes the iPhone?",
            [["company that makes the iPhone"], ["founders of Apple", "Steve Jobs Wozniak"], ["Apple history"]],
        )
        yield ("What year was the author of Hamlet born?", [["author of Hamlet"], ["Shakespeare birth year"]])
        yield ("Where was the director of Jaws born?", [["director of Jaws"], ["Spielberg birthplace"], ["Cincinnati"]])

    sequences = sequences_from_pairs(traces)
    assert [s.id for s in sequences] == ["0", "1", "2", "3"]
    table = analyze_momentum(sequences, minilm_encoder, MomentumOptions(step_query="paths"))
    assert table.options["step_query"] == "paths" and len(table.steps) == 2


def test_drift_hand_worked_and_on_musique(realdata, minilm_encoder):
    from maps_train.analysis.embed import embed_evidence, embed_sequences

    q0 = np.array([1.0, 0.0])
    rounds = [[np.array([[0.0, 1.0]]), np.array([[-1.0, 0.0]])]]
    curves = drift_curves("hand", [q0], rounds, None, betas=0.0)
    # question drift: round 1: 1 - cos((0,1),(1,0)) = 1; round 2: 1 - cos((-1,0),(1,0)) = 2.
    # β = 0 makes m_t = q_t - q_{t-1}: m_1 = (-1,1), m_2 = (-1,-1): cos(m_t, q_0) = -1/√2 both times, no drift.
    assert [c.question_drift for c in curves] == pytest.approx([1.0, 2.0])
    assert [c.drift for c in curves] == pytest.approx([0.0, 0.0])

    sequences = load_sequences(realdata / "musique" / "dev.jsonl")[:60]
    questions, subqueries = embed_sequences(sequences, minilm_encoder)
    evidence = embed_evidence(sequences, minilm_encoder)
    curves = drift_curves("gold", questions, subqueries, evidence)
    assert [c.round for c in curves][:2] == [1, 2] and curves[0].n == 60 and curves[0].n_evidence == 60
    # Real behaviour: sub-queries sit closer to their own gold passages than to another question's.
    shuffled = drift_curves("shuffled", questions, subqueries, evidence[1:] + evidence[:1])
    assert curves[0].evidence_similarity > shuffled[0].evidence_similarity + 0.1


def test_stops(tmp_path):
    path = tmp_path / "answers.jsonl"
    rows = [{"id": str(i), "rounds": r} for i, r in enumerate([1, 1, 2, 3, 5, 7, 1, 2])]
    rows.append({"id": "x", "rounds": [{"round": 1}, {"round": 2}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = stop_stats("maps", [r for _, r in load_stop_rounds(path)])
    assert (
        stats.n == 9
        and stats.share_round_1 == pytest.approx(3 / 9)
        and stats.share_round_5_plus == pytest.approx(2 / 9)
    )
    path.write_text('{"id": "a", "rounds": "two"}\n')
    with pytest.raises(MapsTrainError, match="answers.jsonl:1: field 'rounds'"):
        load_stop_rounds(path)


def test_cli_writes_tables_and_plots(tmp_path, minilm, realdata):
    from typer.testing import CliRunner

    from maps_train.cli import app

    answers = tmp_path / "maps.jsonl"
    answers.write_text("".join(json.dumps({"id": str(i), "rounds": r}) + "\n" for i, r in enumerate([1, 2, 5])))
    result = CliRunner().invoke(app, ["analyze", "stops", "--input", f"maps={answers}", "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s" / "stops.png").stat().st_size > 0 and "33.3%" in (tmp_path / "s" / "stops.md").read_text()

    subset = tmp_path / "musique.jsonl"
    subset.write_text("".join((realdata / "musique" / "dev.jsonl").read_text().splitlines(True)[:40]))
    out = tmp_path / "m"
    result = CliRunner().invoke(app, ["analyze", "momentum", str(subset), "--encoder", minilm, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"momentum.md", "momentum.csv", "momentum.json", "momentum.png"}
    result = CliRunner().invoke(
        app,
        [
            "analyze",
            "drift",
            "--input",
            f"gold={subset}",
            "--encoder",
            minilm,
            "--betas",
            str(out / "momentum.json"),
            "--out",
            str(tmp_path / "d"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d" / "drift.png").stat().st_size > 0
