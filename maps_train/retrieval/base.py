"""The retrieval interface every searcher implements."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """One batched search: a ranked list of `k` hits per query, best first."""
        ...
