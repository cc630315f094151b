"""The answer record (one line of a run's `answers.jsonl`) and its typed cost, shared by every stage.

The runner writes an `AnswerRecord` per question; the eval suite scores it; the reports and the demo report read
it back with `AnswerRecord.from_dict`, which checks every field and names the one that is wrong.

Cost under batching: a backend reports each completion's latency (the time of the batch it ran in, or its own
request time for HTTP backends). A question's requests within one batched call ran side by side, so the call
adds the LONGEST of their latencies (not the sum: N writer rows of one batch are one wait, not N). A question's
`latency_s` is that, summed over its calls, plus its share of each batched search (the search time split evenly
over the sub-queries in the batch); it approximates how long the question would take alone at this batching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maps_train.errors import MapsTrainError

# Counters every cost carries (0 when a foreign record leaves them out), as the reports show them.
# `truncated_calls`: calls whose prompt was shrunk (or cut) to fit the context, `prompt_tokens_dropped` what they
# left out.
# `reasoning_capped_calls`: calls whose reasoning hit max_tokens; `length_capped_calls`: calls that hit it at all.
# `stops_in_reasoning`: stop strings that fired inside unclosed reasoning and were written past (maps_train.llm.budget).
ROLE_KEYS = (
    "calls", "prompt_tokens", "completion_tokens", "reasoning_tokens", "truncated_calls", "prompt_tokens_dropped",
    "reasoning_capped_calls", "length_capped_calls", "stops_in_reasoning",
)
COST_KEYS = (*ROLE_KEYS, "retrievals", "passages", "latency_s")


class RecordFormatError(MapsTrainError):
    """A record (answer, trace) that does not match its type; the message names the field."""


def _number(data: dict[str, Any], key: str, where: str, kind: type, error: type[MapsTrainError]) -> Any:
    value = data.get(key)
    if value is None:
        return kind(0)
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise error(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return kind(value)


@dataclass
class RoleCost:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0  # every generated token, thinking included
    latency_s: float = 0.0
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking (0 in records from before thinking)
    truncated_calls: int = 0  # calls whose prompt did not fit the context as built
    prompt_tokens_dropped: int = 0  # what those calls left out
    reasoning_capped_calls: int = 0  # calls whose reasoning hit max_tokens (see maps_train.llm.budget)
    length_capped_calls: int = 0  # calls that hit max_tokens at all, in the reasoning or not
    stops_in_reasoning: int = 0  # stop strings inside the reasoning, written past (see maps_train.llm.budget)

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "reasoning_tokens": self.reasoning_tokens,
                "truncated_calls": self.truncated_calls, "prompt_tokens_dropped": self.prompt_tokens_dropped,
                "reasoning_capped_calls": self.reasoning_capped_calls,
                "length_capped_calls": self.length_capped_calls, "stops_in_reasoning": self.stops_in_reasoning,
                "latency_s": round(self.latency_s, 4)}

    @classmethod
    def from_dict(cls, data: Any, where: str, error: type[MapsTrainError] = RecordFormatError) -> RoleCost:
        if not isinstance(data, dict):
            raise error(f"{where}: expected an object")
        return cls(**{key: _number(data, key, where, int, error) for key in ROLE_KEYS},
                   latency_s=_number(data, "latency_s", where, float, error))


@dataclass
class Cost:
    """A question's cost: calls, tokens and latency per role, and its retrievals. Built up while it runs."""

    by_role: dict[str, RoleCost] = field(default_factory=dict)
    retrievals: int = 0  # sub-queries sent to the retriever
    passages: int = 0  # hits returned for them (before merging)
    retrieval_latency_s: float = 0.0

    def add_completion(
        self, role: str, prompt_tokens: int | None, completion_tokens: int | None, reasoning_tokens: int | None = 0
    ) -> None:
        """Calls and tokens (`reasoning_tokens` is the thinking part of `completion_tokens`); latency is booked
        per batched call with `add_latency` (see the module docstring)."""
        cost = self.by_role.setdefault(role, RoleCost())
        cost.calls += 1
        cost.prompt_tokens += int(prompt_tokens or 0)
        cost.completion_tokens += int(completion_tokens or 0)
        cost.reasoning_tokens += int(reasoning_tokens or 0)

    def add_dropped(self, role: str, prompt_tokens_dropped: int) -> None:
        """A call whose prompt was shrunk to fit the context (see `backend.truncate_prompt`)."""
        cost = self.by_role.setdefault(role, RoleCost())
        cost.truncated_calls += 1
        cost.prompt_tokens_dropped += int(prompt_tokens_dropped)

    def add_caps(self, role: str, reasoning_capped: bool, length_capped: bool) -> None:
        """A call that hit its max_tokens: inside its reasoning, or anywhere."""
        cost = self.by_role.setdefault(role, RoleCost())
        cost.reasoning_capped_calls += int(reasoning_capped)
        cost.length_capped_calls += int(length_capped)

    def add_stops_in_reasoning(self, role: str, stops: int) -> None:
        """Stop strings that fired inside a call's reasoning and were written past."""
        self.by_role.setdefault(role, RoleCost()).stops_in_reasoning += int(stops)

    def add_latency(self, role: str, latency_s: float) -> None:
        self.by_role.setdefault(role, RoleCost()).latency_s += latency_s

    def add_search(self, queries: int, passages: int, latency_s: float) -> None:
        self.retrievals += queries
        self.passages += passages
        self.retrieval_latency_s += latency_s

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.by_role.values())

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.by_role.values())

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.by_role.values())

    @property
    def reasoning_tokens(self) -> int:
        return sum(c.reasoning_tokens for c in self.by_role.values())

    @property
    def truncated_calls(self) -> int:
        return sum(c.truncated_calls for c in self.by_role.values())

    @property
    def prompt_tokens_dropped(self) -> int:
        return sum(c.prompt_tokens_dropped for c in self.by_role.values())

    @property
    def reasoning_capped_calls(self) -> int:
        return sum(c.reasoning_capped_calls for c in self.by_role.values())

    @property
    def length_capped_calls(self) -> int:
        return sum(c.length_capped_calls for c in self.by_role.values())

    @property
    def stops_in_reasoning(self) -> int:
        return sum(c.stops_in_reasoning for c in self.by_role.values())

    @property
    def latency_s(self) -> float:
        return round(sum(c.latency_s for c in self.by_role.values()) + self.retrieval_latency_s, 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "truncated_calls": self.truncated_calls,
            "prompt_tokens_dropped": self.prompt_tokens_dropped,
            "reasoning_capped_calls": self.reasoning_capped_calls,
            "length_capped_calls": self.length_capped_calls,
            "stops_in_reasoning": self.stops_in_reasoning,
            "by_role": {role: cost.to_dict() for role, cost in self.by_role.items()},
            "retrievals": self.retrievals,
            "passages": self.passages,
            "retrieval_latency_s": round(self.retrieval_latency_s, 4),
            "latency_s": self.latency_s,
        }

    def rounded(self) -> Cost:
        """This cost as it reads back from a file (latencies to 0.1 ms), so a record equals its round trip."""
        return Cost.from_dict(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, where: str = "cost", error: type[MapsTrainError] = RecordFormatError) -> Cost:
        """The cost block of a record; missing counters are 0. A cost without `by_role` (a foreign tool's) keeps
        its totals under the role "default", so totals and compute estimates still add up."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise error(f"{where}: expected an object")
        by_role = data.get("by_role")
        if by_role is None:
            totals = {key: data.get(key) for key in (*ROLE_KEYS, "latency_s")}
            by_role = {"default": totals} if any(totals.values()) else {}
        if not isinstance(by_role, dict):
            raise error(f"{where}.by_role: expected an object")
        return cls(
            by_role={str(role): RoleCost.from_dict(usage, f"{where}.by_role.{role}", error)
                     for role, usage in by_role.items()},
            retrievals=_number(data, "retrievals", where, int, error),
            passages=_number(data, "passages", where, int, error),
            retrieval_latency_s=_number(data, "retrieval_latency_s", where, float, error),
        )


@dataclass
class AnswerRecord:
    """One question's answer as a method gave it, with what it cost."""

    question_id: str
    answer: str | None
    method: str | None = None
    dataset: str | None = None
    rounds: int | None = None  # the method's own rounds (MAPS rounds, baseline turns)
    stop_reason: str | None = None
    cost: Cost = field(default_factory=Cost)
    parse_failures: dict[str, int] = field(default_factory=dict)  # role -> calls whose output took the fallback
    config_digest: str | None = None
    # Retrieval rounds actually executed: batched searches that held at least one of this question's queries
    # (the same meaning for every method; 0 when it answered without searching). None in older records.
    retrieval_rounds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "answer": self.answer,
            "method": self.method,
            "dataset": self.dataset,
            "rounds": self.rounds,
            "retrieval_rounds": self.retrieval_rounds,
            "stop_reason": self.stop_reason,
            "cost": self.cost.to_dict(),
            "parse_failures": dict(self.parse_failures),
            "config_digest": self.config_digest,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "answer record") -> AnswerRecord:
        """Only `question_id` and `answer` are required; every field present must have its type."""
        if isinstance(data, AnswerRecord):
            return data
        if not isinstance(data, dict):
            raise RecordFormatError(f"{where}: answer record is {type(data).__name__}, expected an object")
        for name in ("question_id", "answer"):
            if name not in data:
                raise RecordFormatError(f"{where}: answer record lacks '{name}'")
        qid = data["question_id"]
        if not isinstance(qid, str | int) or isinstance(qid, bool):
            raise RecordFormatError(f"{where}: question_id: expected a string, got {qid!r}")
        at = f"{where}: question {qid}"
        for name, kinds in (("answer", str), ("method", str), ("dataset", str), ("stop_reason", str),
                            ("config_digest", str), ("rounds", int), ("retrieval_rounds", int)):
            value = data.get(name)
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                raise RecordFormatError(f"{at}: '{name}' must be {kinds.__name__}, got {type(value).__name__}")
        failures = data.get("parse_failures") or {}
        if not isinstance(failures, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in failures.values()
        ):
            raise RecordFormatError(f"{at}: 'parse_failures' must map roles to counts")
        return cls(
            question_id=str(qid),
            answer=data["answer"],
            method=data.get("method"),
            dataset=data.get("dataset"),
            rounds=data.get("rounds"),
            stop_reason=data.get("stop_reason"),
            cost=Cost.from_dict(data.get("cost"), f"{at}: cost"),
            parse_failures={str(k): v for k, v in failures.items()},
            config_digest=data.get("config_digest"),
            retrieval_rounds=data.get("retrieval_rounds"),
        )
