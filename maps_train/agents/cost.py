"""Per-question cost: calls and tokens per role, retrievals and passages, latency.

Latency under batching: a backend reports each completion's latency (the time of the batch it ran in, or its own
request time for HTTP backends). A question's requests within one batched call ran side by side, so the call
adds the LONGEST of their latencies (not the sum: N writer rows of one batch are one wait, not N). A question's
`latency_s` is that, summed over its calls, plus its share of each batched search (the search time split evenly
over the sub-queries in the batch); it approximates how long the question would take alone at this batching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maps_train.llm.types import Completion


@dataclass
class RoleCost:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


@dataclass
class CostLedger:
    by_role: dict[str, RoleCost] = field(default_factory=dict)
    retrievals: int = 0  # sub-queries sent to the retriever
    passages: int = 0  # hits returned for them (before merging)
    retrieval_latency_s: float = 0.0

    def add_completion(self, role: str, completion: Completion) -> None:
        """Calls and tokens; latency is booked per batched call with `add_latency` (see the module docstring)."""
        cost = self.by_role.setdefault(role, RoleCost())
        cost.calls += 1
        cost.prompt_tokens += int(completion.prompt_tokens or 0)
        cost.completion_tokens += int(completion.completion_tokens or 0)

    def add_latency(self, role: str, latency_s: float) -> None:
        self.by_role.setdefault(role, RoleCost()).latency_s += latency_s

    def add_search(self, queries: int, passages: int, latency_s: float) -> None:
        self.retrievals += queries
        self.passages += passages
        self.retrieval_latency_s += latency_s

    def to_dict(self) -> dict[str, Any]:
        roles = self.by_role.values()
        llm_latency = sum(c.latency_s for c in roles)
        return {
            "calls": sum(c.calls for c in roles),
            "prompt_tokens": sum(c.prompt_tokens for c in roles),
            "completion_tokens": sum(c.completion_tokens for c in roles),
            "by_role": {
                role: {
                    "calls": c.calls,
                    "prompt_tokens": c.prompt_tokens,
                    "completion_tokens": c.completion_tokens,
                    "latency_s": round(c.latency_s, 4),
                }
                for role, c in self.by_role.items()
            },
            "retrievals": self.retrievals,
            "passages": self.passages,
            "retrieval_latency_s": round(self.retrieval_latency_s, 4),
            "latency_s": round(llm_latency + self.retrieval_latency_s, 4),
        }
