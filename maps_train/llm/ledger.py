"""The cost ledger: every LLM call's tokens and latency, attributed to its question and role.

Rows are appended to a JSONL file (never rewritten) and kept in memory for summaries. One row per request:
`latency_s` is the wall time of the batched backend call the request rode in (what the question waited), and
`batch_size` says how many requests shared it, so `latency_s / batch_size` is the request's share of the
engine's time. A disabled ledger records nothing and costs nothing.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from maps_train.llm.types import ChatRequest, Completion

_SUMMED = ("calls", "prompt_tokens", "completion_tokens", "latency_s", "engine_s")


class CostLedger:
    def __init__(self, path: str | Path | None = None, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(path) if path else None
        self.rows: list[dict[str, Any]] = []
        self._file = None
        self._batches = 0
        if self.enabled and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def record(
        self, requests: list[ChatRequest], completions: list[Completion], backend: str, batch_latency_s: float
    ) -> None:
        """One batched backend call: one row per request."""
        if not self.enabled:
            return
        self._batches += 1
        now = time.time()
        rows = [
            {
                "ts": now,
                "batch": self._batches,
                "question_id": req.question_id,
                "role": req.role,
                "backend": backend,
                "model": comp.model,
                "adapter": comp.adapter,
                "prompt_tokens": comp.prompt_tokens,
                "completion_tokens": comp.completion_tokens,
                "latency_s": round(comp.latency_s, 6),
                "batch_size": len(requests),
                "batch_latency_s": round(batch_latency_s, 6),
                "finish_reason": comp.finish_reason,
            }
            for req, comp in zip(requests, completions)
        ]
        self.rows.extend(rows)
        if self._file is not None:
            self._file.write("".join(json.dumps(r) + "\n" for r in rows))
            self._file.flush()

    def summary(self, by: str = "role") -> dict[str, dict[str, float]]:
        """Totals per `role`, `question_id`, `model` or `adapter` (any row key)."""
        return summarise(self.rows, by)

    def totals(self) -> dict[str, float]:
        return summarise(self.rows, None)["all"]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        """Rows of a ledger file (a torn last line from a killed run is skipped)."""
        rows = []
        with Path(path).open(encoding="utf-8") as handle:
            for line in handle:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows


def summarise(rows: Iterable[dict[str, Any]], by: str | None) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_SUMMED, 0.0))
    for row in rows:
        key = "all" if by is None else str(row.get(by))
        entry = totals[key]
        entry["calls"] += 1
        entry["prompt_tokens"] += row["prompt_tokens"]
        entry["completion_tokens"] += row["completion_tokens"]
        entry["latency_s"] += row["latency_s"]
        entry["engine_s"] += row["batch_latency_s"] / max(row["batch_size"], 1)
    if by is None and not totals:
        totals["all"]
    return {
        k: {n: (int(v) if n.endswith("tokens") or n == "calls" else round(v, 6)) for n, v in e.items()}
        for k, e in totals.items()
    }
