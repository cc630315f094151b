"""Drift across rounds (paper 3.3), per method: how the search moves away from the question, round by round.

Per question, with q_0 the question's embedding, q_t round t's (the mean of its sub-queries' unit embeddings,
re-normalised; or its first) and the momentum m_t = β_t m_{t-1} + (1-β_t)(q_t - q_{t-1}) (as in `momentum`):
- `drift` at round t: the change in cos(m_t, q_0) accumulated over rounds, Σ_{s=2..t} [cos(m_s, q_0) -
  cos(m_{s-1}, q_0)] (0 at round 1; negative: the search direction turns away from the question). The sum
  telescopes to cos(m_t, q_0) - cos(m_1, q_0) for one question; the curve averages it over the questions that
  reach round t.
- `abs_drift`: Σ_{s=2..t} |cos(m_s, q_0) - cos(m_{s-1}, q_0)|, the same path without cancellation (a search that
  swings away and back shows here, not in `drift`).
- `evidence_similarity`: for questions whose gold passages are known, the mean over the round's sub-queries of
  the highest cosine to a gold passage (passages embedded with the encoder's passage prefix); `n_evidence`
  counts those questions.
- `question_drift` (kept from the earlier measures: it needs no β, so it checks that `drift` is not an artefact
  of the fitted β): 1 - cos(sub-query, q_0), averaged over the round's sub-queries.
(The earlier `momentum_turn`, the accumulated 1 - cos(m_t, m_{t-1}), is gone: it measures how the momentum turns,
not where it points relative to the question, which is what 3.3 compares.)

The paper's protocol draws 500 questions at random across all data sets of a suite, the same for every method
(`sample_keys`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from maps_train.analysis.momentum import M0, _unit
from maps_train.errors import MapsTrainError

DRIFT_QUESTIONS = 500  # the paper's sample size for 3.3


@dataclass
class DriftRound:
    method: str
    round: int
    n: int
    drift: float
    abs_drift: float
    evidence_similarity: float
    n_evidence: int
    question_drift: float


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 1e-12 else 0.0


def sample_keys(keys: Iterable[tuple[str, str]], n: int | None = DRIFT_QUESTIONS, seed: int = 0) -> set:
    """`n` (data set, question id) keys drawn at random with `seed` from the distinct `keys` (all when fewer)."""
    distinct = sorted(set(keys))
    if n is None or n >= len(distinct):
        return set(distinct)
    return set(random.Random(seed).sample(distinct, n))


def momentum_path(q0: np.ndarray, points: list[np.ndarray], betas: list[float], m0: M0 = "zero") -> list[np.ndarray]:
    """[m_1, ..., m_T] for q_0 and round points q_1..q_T; rounds beyond the given β's reuse the last β."""
    if m0 == "zero":
        m = np.zeros_like(q0)
    elif m0 == "question":
        m = q0.copy()
    elif m0 == "first-step":
        m = points[0] - q0 if points else q0
    else:
        raise MapsTrainError(f"m0 '{m0}': want zero, first-step or question")
    out, previous = [], q0
    for t, point in enumerate(points, start=1):
        beta = betas[min(t, len(betas)) - 1]
        m = beta * m + (1.0 - beta) * (point - previous)
        out.append(m)
        previous = point
    return out


def drift_curves(
    method: str,
    questions: list[np.ndarray],
    rounds: list[list[np.ndarray]],
    evidence: list[np.ndarray] | None = None,
    betas: list[float] | float = 0.0,
    m0: M0 = "zero",
    step_query: str = "mean",
) -> list[DriftRound]:
    """Per-round drift curves of one method (means over the questions that reach each round)."""
    betas = [float(betas)] if isinstance(betas, int | float) else [float(b) for b in betas]
    if not betas:
        raise MapsTrainError("drift: no β given")
    if step_query not in ("first", "mean"):
        raise MapsTrainError(f"drift: step_query '{step_query}': want first or mean")
    per_round: dict[int, dict[str, list[float]]] = {}
    for index, (q0, question_rounds) in enumerate(zip(questions, rounds)):
        gold = evidence[index] if evidence is not None else None
        points = [r[0] if step_query == "first" else _unit(r.mean(axis=0)) for r in question_rounds]
        cosines = [_cos(m, q0) for m in momentum_path(q0, points, betas, m0)]
        signed = absolute = 0.0
        for t, round_vectors in enumerate(question_rounds, start=1):
            if t > 1:
                change = cosines[t - 1] - cosines[t - 2]
                signed += change
                absolute += abs(change)
            bucket = per_round.setdefault(t, {"drift": [], "abs": [], "question": [], "evidence": []})
            bucket["drift"].append(signed)
            bucket["abs"].append(absolute)
            bucket["question"].append(float(np.mean([1.0 - _cos(v, q0) for v in round_vectors])))
            if gold is not None and len(gold):
                bucket["evidence"].append(float(np.mean(np.max(round_vectors @ gold.T, axis=1))))
    return [
        DriftRound(
            method,
            t,
            len(b["drift"]),
            float(np.mean(b["drift"])),
            float(np.mean(b["abs"])),
            float(np.mean(b["evidence"])) if b["evidence"] else float("nan"),
            len(b["evidence"]),
            float(np.mean(b["question"])),
        )
        for t, b in sorted(per_round.items())
    ]


def load_betas(path: str | Path) -> list[float]:
    """β_t from a `momentum.json` written by `maps-train analyze momentum` (the pooled fit of a multi-method one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        steps = data["pooled"]["steps"] if "pooled" in data else data["steps"]
        return [float(s["beta"]) for s in steps]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MapsTrainError(f"{path}: not a momentum.json with steps[].beta ({err})") from None


def drift_rows(curves: list[DriftRound]) -> list[dict]:
    return [asdict(c) for c in curves]


def drift_markdown(curves: list[DriftRound], note: str = "") -> str:
    lines = [
        "| method | round | n | drift: acc. Δcos(m_t, q_0) | acc. abs Δcos | evidence similarity | n evidence "
        "| question drift 1-cos(q_t, q_0) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in curves:
        lines.append(
            f"| {c.method} | {c.round} | {c.n} | {c.drift:+.4f} | {c.abs_drift:.4f} | {c.evidence_similarity:.3f} "
            f"| {c.n_evidence} | {c.question_drift:.3f} |"
        )
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"
