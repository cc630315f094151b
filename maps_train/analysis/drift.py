"""Drift across rounds (paper 3.3), per method: how far the search moves from the question and the evidence.

The paper leaves the exact measures open; ours, per round t (means over the questions that reach round t):
- `question_drift`: 1 - cos(sub-query, q_0), averaged over the round's sub-queries: how far the round's
  sub-queries have moved from the question.
- `momentum_turn`: Σ_{s=2..t} (1 - cos(m_s, m_{s-1})): the accumulated change of the momentum direction
  (m_t as in `momentum`, with given or fitted β_t; 0 at round 1).
- `evidence_similarity`: for questions whose gold passages are known (`metadata.supporting_paragraphs` text),
  the mean over the round's sub-queries of the highest cosine to a gold passage (passages embedded with the
  encoder's passage prefix). `n_evidence` says how many questions it averages.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from maps_train.analysis.momentum import M0, _unit
from maps_train.errors import MapsTrainError


@dataclass
class DriftRound:
    method: str
    round: int
    n: int
    question_drift: float
    momentum_turn: float
    evidence_similarity: float
    n_evidence: int


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 1e-12 else 0.0


def drift_curves(
    method: str,
    questions: list[np.ndarray],
    rounds: list[list[np.ndarray]],
    evidence: list[np.ndarray] | None = None,
    betas: list[float] | float = 0.5,
    m0: M0 = "zero",
    step_query: str = "mean",
) -> list[DriftRound]:
    """Per-round drift for one method; rounds beyond the fitted β's reuse the last β."""
    betas = [float(betas)] if isinstance(betas, (int, float)) else list(betas)
    if not betas:
        raise MapsTrainError("drift: no β given")
    per_round: dict[int, dict[str, list[float]]] = {}
    for index, (q0, question_rounds) in enumerate(zip(questions, rounds)):
        gold = evidence[index] if evidence is not None else None
        points = [q0]
        for r in question_rounds:
            points.append(r[0] if step_query == "first" else _unit(r.mean(axis=0)))
        m_prev = {"zero": np.zeros_like(q0), "question": q0, "first-step": points[1] - q0 if len(points) > 1 else q0}[
            m0
        ]
        turn = 0.0
        for t, round_vectors in enumerate(question_rounds, start=1):
            beta = betas[min(t, len(betas)) - 1]
            m = beta * m_prev + (1.0 - beta) * (points[t] - points[t - 1])
            if t > 1:
                turn += 1.0 - _cos(m, m_prev)
            m_prev = m
            bucket = per_round.setdefault(t, {"drift": [], "turn": [], "evidence": []})
            bucket["drift"].append(float(np.mean([1.0 - _cos(v, q0) for v in round_vectors])))
            bucket["turn"].append(turn)
            if gold is not None and len(gold):
                bucket["evidence"].append(float(np.mean(np.max(round_vectors @ gold.T, axis=1))))
    return [
        DriftRound(
            method,
            t,
            len(b["drift"]),
            float(np.mean(b["drift"])),
            float(np.mean(b["turn"])),
            float(np.mean(b["evidence"])) if b["evidence"] else float("nan"),
            len(b["evidence"]),
        )
        for t, b in sorted(per_round.items())
    ]


def load_betas(path: str | Path) -> list[float]:
    """β_t from a `momentum.json` written by `maps-train analyze momentum`."""
    path = Path(path)
    try:
        steps = json.loads(path.read_text(encoding="utf-8"))["steps"]
        return [float(s["beta"]) for s in steps]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MapsTrainError(f"{path}: not a momentum.json with steps[].beta ({err})") from None


def drift_rows(curves: list[DriftRound]) -> list[dict]:
    return [asdict(c) for c in curves]


def drift_markdown(curves: list[DriftRound]) -> str:
    lines = [
        "| method | round | n | question drift | momentum turn (acc.) | evidence similarity | n evidence |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in curves:
        lines.append(
            f"| {c.method} | {c.round} | {c.n} | {c.question_drift:.3f} | {c.momentum_turn:.3f} "
            f"| {c.evidence_similarity:.3f} | {c.n_evidence} |"
        )
    return "\n".join(lines) + "\n"
