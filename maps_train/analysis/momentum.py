"""Search momentum: how well an exponential average of past query moves predicts where the search goes next.

q_0 is the question's embedding, q_t the step-t sub-query's, and
    m_t = β_t m_{t-1} + (1 - β_t)(q_t - q_{t-1}),    S_t = cos(m_t, q_{t+1} - q_0).
One β_t per step is fitted with SciPy's L-BFGS-B (bounds [0, 1]) to maximise the mean S_t on a training split,
and S_t is reported on a held-out split. Choices the definition leaves open are options (`MomentumOptions`):

- m_0: `zero` (default), `first-step` (q_1 - q_0) or `question` (q_0). With `zero`, m_1 = (1-β_1)(q_1-q_0)
  points the same way for every β_1 < 1, and with `first-step` m_1 = q_1 - q_0 for every β_1, so S_1 does not
  depend on β_1: the fit fixes it at `beta_init` and the table marks it "not identified". `beta_init` is 0 by
  default, so m_1 = q_1 - q_0 and β_1 = 0, as the paper prints it. Under `zero`, β_1 still sets the LENGTH of
  m_1, which the later β_t absorb (MuSiQue gold: β_2, β_3 = 0.52, 0.83 with β_1 = 0; 0.69, 0.87 with β_1 = 0.5),
  so β_t are comparable only under one convention: `beta_init` is echoed in every table.
- unequal lengths: a sequence with T steps contributes to S_t only when it has q_{t+1}, i.e. for t <= T-1;
  the table reports n (questions) per step and split.
- which sub-query is "the" step-t query when a round has several: `first`, `mean` (mean of the round's unit
  embeddings, re-normalised) or `paths` (every path through the rounds, one q_t per round, each question's paths
  weighted to sum to 1; at most `max_paths` sampled, seeded).
- fitting: `sequential` (β_t maximises mean S_t with β_1..β_{t-1} fixed at their fitted values; a coarse grid
  picks the start so a non-concave S_t does not trap L-BFGS-B) or `joint` (the identified β maximise the mean
  over steps of mean S_t, started from the sequential fit; an unidentified β stays at `beta_init`, else the
  joint fit would set it through the later steps' scale, against the stated convention).
- the split is by question (seeded), before any path expansion.

The table also gives held-out S_t with every β = 0 (m_t = q_t - q_{t-1}: "the last move only") as a reference.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from maps_train.errors import MapsTrainError

M0 = Literal["zero", "first-step", "question"]
StepQuery = Literal["first", "mean", "paths"]
Fit = Literal["sequential", "joint"]


@dataclass
class MomentumOptions:
    m0: M0 = "zero"
    step_query: StepQuery = "first"
    fit: Fit = "sequential"
    # The value of a β_t that S_t does not depend on (β_1 under m_0 = zero or first-step). 0: m_1 = q_1 - q_0, the
    # paper's convention; 0.5 reproduces this code's earlier tables.
    beta_init: float = 0.0
    train_fraction: float = 0.5
    seed: int = 0
    max_paths: int = 64  # step_query = paths: paths sampled per question at most


@dataclass
class Trajectories:
    """Padded per-path points q_0..q_T, ready for vectorised momentum."""

    question_ids: list[str]  # one per path (several paths share a question under step_query = paths)
    points: np.ndarray  # (paths, max_T + 1, dim), zero beyond each path's length
    lengths: np.ndarray  # (paths,) T: the number of sub-query steps
    weights: np.ndarray  # (paths,) each question's paths sum to 1

    def subset(self, keep_ids: set[str]) -> Trajectories:
        rows = [i for i, qid in enumerate(self.question_ids) if qid in keep_ids]
        return Trajectories(
            [self.question_ids[i] for i in rows], self.points[rows], self.lengths[rows], self.weights[rows]
        )


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vector)
    return vector / norm if norm > 0 else vector


def trajectories_from_rounds(
    question_ids: list[str],
    questions: list[np.ndarray],
    rounds: list[list[np.ndarray]],
    step_query: StepQuery = "first",
    max_paths: int = 64,
    seed: int = 0,
) -> Trajectories:
    """Trajectories from q_0 and each round's (n_queries, dim) embeddings, picking q_t as `step_query` says."""
    if not (len(question_ids) == len(questions) == len(rounds)):
        raise MapsTrainError("trajectories: question_ids, questions and rounds differ in length")
    paths: list[tuple[str, np.ndarray, float]] = []
    for index, (qid, q0, question_rounds) in enumerate(zip(question_ids, questions, rounds)):
        if not question_rounds:
            continue  # no sub-query at all: nothing to score
        if step_query == "first":
            choices = [[r[0] for r in question_rounds]]
        elif step_query == "mean":
            choices = [[_unit(r.mean(axis=0)) for r in question_rounds]]
        elif step_query == "paths":
            sizes = [len(r) for r in question_rounds]
            total = math.prod(sizes)
            if total <= max_paths:
                picks = list(itertools.product(*[range(s) for s in sizes]))
            else:
                rng = np.random.default_rng([seed, index])
                picks = [tuple(int(rng.integers(s)) for s in sizes) for _ in range(max_paths)]
            choices = [[r[j] for r, j in zip(question_rounds, pick)] for pick in picks]
        else:
            raise MapsTrainError(f"step_query '{step_query}': want first, mean or paths")
        for choice in choices:
            paths.append((qid, np.stack([q0, *choice]), 1.0 / len(choices)))
    if not paths:
        raise MapsTrainError("trajectories: no sequences")
    dim = paths[0][1].shape[1]
    width = max(p.shape[0] for _, p, _ in paths)
    points = np.zeros((len(paths), width, dim))
    for row, (_, p, _) in enumerate(paths):
        points[row, : p.shape[0]] = p
    return Trajectories(
        [qid for qid, _, _ in paths],
        points,
        np.array([p.shape[0] - 1 for _, p, _ in paths]),
        np.array([w for _, _, w in paths]),
    )


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine; 0 where either vector is zero (e.g. m_1 with m_0 = 0 and β_1 = 1)."""
    dots = np.einsum("ij,ij->i", a, b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 1e-12, dots / np.maximum(norms, 1e-12), 0.0)


def initial_momentum(points: np.ndarray, m0: M0) -> np.ndarray:
    if m0 == "zero":
        return np.zeros_like(points[:, 0])
    if m0 == "first-step":
        return points[:, 1] - points[:, 0]
    if m0 == "question":
        return points[:, 0].copy()
    raise MapsTrainError(f"m0 '{m0}': want zero, first-step or question")


def momenta(points: np.ndarray, betas: list[float] | np.ndarray, m0: M0 = "zero") -> list[np.ndarray]:
    """[m_0, m_1, ..., m_len(betas)] for every row of `points` (rows shorter than a step get meaningless values)."""
    m = initial_momentum(points, m0)
    out = [m]
    for t, beta in enumerate(betas, start=1):
        m = beta * m + (1.0 - beta) * (points[:, t] - points[:, t - 1])
        out.append(m)
    return out


def step_scores(traj: Trajectories, betas: list[float] | np.ndarray, m0: M0 = "zero") -> list[tuple[int, float]]:
    """Per step t = 1..len(betas): (questions contributing, weighted mean S_t); NaN where none contribute."""
    betas = list(betas)
    usable = min(len(betas), traj.points.shape[1] - 2)
    ms = momenta(traj.points, betas[:usable], m0)
    scores = []
    for t in range(1, len(betas) + 1):
        rows = traj.lengths >= t + 1
        if t > usable or not rows.any():
            scores.append((0, float("nan")))
            continue
        s = _cos(ms[t][rows], traj.points[rows, t + 1] - traj.points[rows, 0])
        w = traj.weights[rows]
        questions = len({qid for qid, keep in zip(traj.question_ids, rows) if keep})
        scores.append((questions, float(np.sum(w * s) / np.sum(w))))
    return scores


def _step_objective(m_prev, step, target, weights):
    def negative_mean_s(x: np.ndarray) -> float:
        s = _cos(x[0] * m_prev + (1.0 - x[0]) * step, target)
        return -float(np.sum(weights * s) / np.sum(weights))

    return negative_mean_s


def fit_betas(
    traj: Trajectories, options: MomentumOptions, num_steps: int | None = None
) -> tuple[list[float], list[bool]]:
    """(β_1..β_T, identified per step) maximising mean S_t on `traj`; T = the last step some path can score."""
    from scipy.optimize import minimize

    if num_steps is None:
        num_steps = int(traj.lengths.max()) - 1
    if num_steps < 1:
        raise MapsTrainError("momentum fit: every sequence has fewer than 2 sub-query steps; S_t needs q_{t+1}")
    betas: list[float] = []
    identified: list[bool] = []
    grid = np.linspace(0.0, 0.95, 20)
    for t in range(1, num_steps + 1):
        rows = traj.lengths >= t + 1
        if not rows.any():
            betas.append(options.beta_init)
            identified.append(False)
            continue
        points = traj.points[rows]
        m_prev = momenta(points, betas, options.m0)[t - 1]
        objective = _step_objective(
            m_prev, points[:, t] - points[:, t - 1], points[:, t + 1] - points[:, 0], traj.weights[rows]
        )
        values = np.array([objective(np.array([b])) for b in grid])
        if np.ptp(values) < 1e-9:  # S_t does not depend on β_t (see the module docstring)
            betas.append(options.beta_init)
            identified.append(False)
            continue
        start = float(grid[int(np.argmin(values))])
        result = minimize(objective, x0=[start], method="L-BFGS-B", bounds=[(0.0, 1.0)])
        betas.append(float(np.clip(result.x[0], 0.0, 1.0)))
        identified.append(True)
    if options.fit == "joint":
        free = [i for i, ident in enumerate(identified) if ident]

        def with_free(x: np.ndarray) -> np.ndarray:
            full = np.array(betas, dtype=float)
            full[free] = x
            return full

        def negative_mean_over_steps(x: np.ndarray) -> float:
            values = [s for _, s in step_scores(traj, with_free(x), options.m0) if not math.isnan(s)]
            return -float(np.mean(values))

        if free:
            start = [betas[i] for i in free]
            result = minimize(negative_mean_over_steps, x0=start, method="L-BFGS-B", bounds=[(0.0, 1.0)] * len(free))
            betas = [float(b) for b in np.clip(with_free(result.x), 0.0, 1.0)]
    elif options.fit != "sequential":
        raise MapsTrainError(f"fit '{options.fit}': want sequential or joint")
    return betas, identified


def split_questions(question_ids: list[str], train_fraction: float, seed: int) -> tuple[set[str], set[str]]:
    """A seeded split of distinct question ids into (train, held-out)."""
    if not 0.0 < train_fraction < 1.0:
        raise MapsTrainError(f"train_fraction {train_fraction}: want a value strictly between 0 and 1")
    unique = sorted(set(question_ids))
    order = np.random.default_rng(seed).permutation(len(unique))
    cut = max(1, min(len(unique) - 1, round(train_fraction * len(unique))))
    train = {unique[i] for i in order[:cut]}
    return train, set(unique) - train


@dataclass
class MomentumStep:
    step: int
    beta: float
    identified: bool
    n_train: int
    n_test: int
    s_train: float
    s_test: float
    s_test_no_momentum: float  # every β = 0: m_t = q_t - q_{t-1}


@dataclass
class MomentumTable:
    steps: list[MomentumStep]
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"options": self.options, "steps": [asdict(s) for s in self.steps]}

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(asdict(self.steps[0])) if self.steps else ["step"])
        writer.writeheader()
        for step in self.steps:
            writer.writerow(asdict(step))
        return buffer.getvalue()

    def to_markdown(self) -> str:
        lines = [
            "| step t | β_t | n train | n held-out | S_t train | S_t held-out | S_t held-out, β=0 |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.steps:
            beta = f"{s.beta:.4f}" + ("" if s.identified else " (not identified)")
            lines.append(
                f"| {s.step} | {beta} | {s.n_train} | {s.n_test} | {s.s_train:.3f} | {s.s_test:.3f} "
                f"| {s.s_test_no_momentum:.3f} |"
            )
        lines.append("")
        if not all(s.identified for s in self.steps):
            fixed = self.options.get("beta_init", 0.0)
            lines.append(
                f"A β_t marked 'not identified' does not change S_t; it is fixed at beta_init = {fixed}"
                + (" (m_1 = q_1 - q_0, as the paper prints β_1)." if fixed == 0 else ".")
                + " The later β_t depend on this convention."
            )
            lines.append("")
        lines.append("Options: " + ", ".join(f"{k}={v}" for k, v in self.options.items()))
        return "\n".join(lines) + "\n"


def momentum_table(
    traj: Trajectories, options: MomentumOptions, extra_options: dict[str, Any] | None = None
) -> MomentumTable:
    """Split by question, fit β on the train split, score both splits: the paper's table."""
    train_ids, test_ids = split_questions(traj.question_ids, options.train_fraction, options.seed)
    train, test = traj.subset(train_ids), traj.subset(test_ids)
    betas, identified = fit_betas(train, options)
    train_scores = step_scores(train, betas, options.m0)
    test_scores = step_scores(test, betas, options.m0)
    baseline = step_scores(test, [0.0] * len(betas), options.m0)
    steps = [
        MomentumStep(t, beta, ident, n_tr, n_te, s_tr, s_te, s_base)
        for t, beta, ident, (n_tr, s_tr), (n_te, s_te), (_, s_base) in zip(
            range(1, len(betas) + 1), betas, identified, train_scores, test_scores, baseline
        )
    ]
    return MomentumTable(steps, {**asdict(options), **(extra_options or {})})


def analyze_momentum(sequences, encoder, options: MomentumOptions, extra_options: dict[str, Any] | None = None):
    """Embed `sequences` (SubquerySequence list) with `encoder` (TextEncoder) and build the momentum table."""
    from maps_train.analysis.embed import embed_sequences

    questions, rounds = embed_sequences(sequences, encoder)
    # Split by question: the same question of two data sets (or of two methods, pooled) is one key per data set.
    keys = [f"{s.dataset}/{s.id}" if s.dataset else s.id for s in sequences]
    traj = trajectories_from_rounds(keys, questions, rounds, options.step_query, options.max_paths, options.seed)
    extra = {"encoder": encoder.name, "query_prefix": repr(encoder.encoder.prefixes.query), **(extra_options or {})}
    return momentum_table(traj, options, extra)
