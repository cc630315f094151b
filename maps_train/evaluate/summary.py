"""Per-question results -> one cell per (system, dataset) plus each system's average (pure data, no files).

Every cell holds the means over its questions of Cover-EM, EM, F1, answer length in words and the cost counters
(calls, prompt/completion tokens, per role too, retrievals, passages, latency, estimated TFLOPs), plus the
distribution of stop rounds and stop reasons. "Avg" is the macro average over the data sets a system was run on,
as the paper's Table 3.1 averages its columns. `truncation` counts (not means) the calls whose prompt had to shrink
to fit the context, the questions that had one, and the prompt tokens they left out; Avg sums them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from statistics import fmean
from typing import Any

from maps_train.records.answer import COST_KEYS, ROLE_KEYS

AVG = "Avg"
SCORE_KEYS = ("cover_em", "em", "f1", "answer_words")


def _mean(values: list[float]) -> float:
    return fmean(values) if values else 0.0


def stop_round(row: dict[str, Any]) -> int | None:
    """The retrieval rounds a question executed (the same meaning for every method); rows scored before answer
    records carried `retrieval_rounds` fall back to the method's own `rounds`."""
    value = row.get("retrieval_rounds")
    return value if value is not None else row.get("rounds")


def _cell(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cell: dict[str, Any] = {"n": len(rows)}
    for key in SCORE_KEYS:
        cell[key] = _mean([float(r.get(key) or 0) for r in rows])
    for key in COST_KEYS:
        cell[key] = _mean([float(r["cost"].get(key) or 0) for r in rows])
    roles = sorted({role for r in rows for role in r["cost"].get("by_role", {})})
    cell["by_role"] = {
        role: {key: _mean([float(r["cost"].get("by_role", {}).get(role, {}).get(key) or 0) for r in rows]) for key in ROLE_KEYS}
        for role in roles
    }
    flops = [r.get("compute_flops") for r in rows]
    cell["compute_tflops"] = None if any(f is None for f in flops) else _mean([f / 1e12 for f in flops])
    stops = [stop_round(r) for r in rows]
    cell["rounds"] = {str(k): v for k, v in sorted(Counter(s for s in stops if s is not None).items())}
    cell["stop_reasons"] = dict(Counter(r.get("stop_reason") or "none" for r in rows).most_common())
    cell["truncation"] = _truncation(rows)
    cell["caps"] = _caps(rows)
    return cell


CAP_KEYS = ("reasoning_capped_calls", "length_capped_calls", "stops_in_reasoning")


def _caps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls that hit max_tokens inside their reasoning, and at all, and stop strings that fired inside the
    reasoning (see `maps_train.llm.budget`), as counts per role and in all."""
    by_role: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAP_KEYS, 0))
    for row in rows:
        for role, usage in row["cost"].get("by_role", {}).items():
            for key in CAP_KEYS:
                by_role[role][key] += int(usage.get(key) or 0)
    return {**{key: sum(c[key] for c in by_role.values()) for key in CAP_KEYS}, "by_role": dict(by_role)}


def _sum_caps(cells: list[dict[str, Any]]) -> dict[str, Any]:
    by_role: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAP_KEYS, 0))
    for cell in cells:
        for role, counts in cell["caps"]["by_role"].items():
            for key in CAP_KEYS:
                by_role[role][key] += counts[key]
    return {**{key: sum(c["caps"][key] for c in cells) for key in CAP_KEYS}, "by_role": dict(by_role)}


def _truncation(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Calls whose prompt did not fit the context as built (see `backend.truncate_prompt`), as counts."""
    calls = [int(r["cost"].get("truncated_calls") or 0) for r in rows]
    return {
        "calls": sum(calls),
        "questions": sum(1 for n in calls if n),
        "prompt_tokens_dropped": sum(int(r["cost"].get("prompt_tokens_dropped") or 0) for r in rows),
    }


def _average(cells: list[dict[str, Any]]) -> dict[str, Any]:
    avg: dict[str, Any] = {"n": sum(c["n"] for c in cells), "datasets": len(cells)}
    for key in SCORE_KEYS + COST_KEYS:
        avg[key] = _mean([c[key] for c in cells])
    roles = sorted({role for c in cells for role in c["by_role"]})
    avg["by_role"] = {
        role: {key: _mean([c["by_role"].get(role, {}).get(key, 0.0) for c in cells]) for key in ROLE_KEYS} for role in roles
    }
    tflops = [c["compute_tflops"] for c in cells]
    avg["compute_tflops"] = None if any(t is None for t in tflops) else _mean(tflops)
    rounds: Counter = Counter()
    reasons: Counter = Counter()
    for c in cells:
        rounds.update({k: v for k, v in c["rounds"].items()})
        reasons.update(c["stop_reasons"])
    avg["rounds"] = {k: rounds[k] for k in sorted(rounds, key=int)}
    avg["stop_reasons"] = dict(reasons.most_common())
    avg["truncation"] = {key: sum(c["truncation"][key] for c in cells) for key in ("calls", "questions",
                                                                                  "prompt_tokens_dropped")}
    avg["caps"] = _sum_caps(cells)
    return avg


def summarize(
    rows: Iterable[dict[str, Any]],
    systems: list[str] | None = None,
    datasets: list[str] | None = None,
    labels: dict[str, str] | None = None,
    suite: str = "",
) -> dict[str, Any]:
    """The summary of a suite's results; `systems`/`datasets` fix the table order (else first-seen order)."""
    groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    seen_systems, seen_datasets = [], []
    for row in rows:
        groups[row["system"]][row["dataset"]].append(row)
        if row["system"] not in seen_systems:
            seen_systems.append(row["system"])
        if row["dataset"] not in seen_datasets:
            seen_datasets.append(row["dataset"])
    systems = [s for s in (systems or []) if s in groups] + [s for s in seen_systems if s not in (systems or [])]
    datasets = [d for d in (datasets or []) if d in seen_datasets] + [d for d in seen_datasets if d not in (datasets or [])]
    cells: dict[str, dict[str, Any]] = {}
    for system in systems:
        per_dataset = {d: _cell(groups[system][d]) for d in datasets if groups[system].get(d)}
        cells[system] = {**per_dataset, AVG: _average(list(per_dataset.values()))}
    return {
        "suite": suite,
        "systems": systems,
        "datasets": datasets,
        "labels": {d: (labels or {}).get(d, d) for d in datasets},
        "cells": cells,
    }
