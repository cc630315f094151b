"""The trace record: one question's whole run, every role call verbatim, versioned for the SFT-set builder.

A `TraceRecord` holds what the model was shown (the rendered messages exactly as sent), what it wrote (the raw
text), what the engine made of it (the parsed output, `parse_ok`), and what it cost, round by round, plus the
sub-queries, the passages each retrieved and the merged evidence. `from_dict` checks the version and every
required field, so a reader can report `file:line: field: problem` instead of failing deep inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.jsonl import decode_object, iter_lines
from maps_train.records.answer import AnswerRecord, Cost, RecordFormatError
from maps_train.records.metrics import normalize_answer
from maps_train.records.store import KeyedJsonl, read_records

TRACE_SCHEMA_VERSION = 1


class TraceFormatError(RecordFormatError):
    """A trace dict that does not match this schema version; the message names the field."""


_MISSING = object()


def _get(data: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """`data[key]` checked against `kinds`; a missing key is an error unless a default is given."""
    path = _at(where, key)
    if key not in data:
        if default is _MISSING:
            raise TraceFormatError(f"{path}: required field is missing")
        return default
    value = data[key]
    if value is None and default is None:
        return None
    # bool is an int subclass: never accept it where a number is meant, or a number where a bool is meant.
    expected = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in expected:
        raise TraceFormatError(f"{path}: expected {_names(expected)}, got {value!r}")
    if float in expected and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected):
        raise TraceFormatError(f"{path}: expected {_names(expected)}, got {type(value).__name__}")
    return value


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


def _str_list(data: dict[str, Any], key: str, where: str) -> list[str]:
    values = _get(data, key, list, where)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TraceFormatError(f"{_at(where, key)}[{i}]: expected str, got {type(value).__name__}")
    return list(values)


def _messages(data: dict[str, Any], where: str) -> list[dict[str, str]]:
    messages = _get(data, "messages", list, where)
    for i, message in enumerate(messages):
        at = f"{_at(where, 'messages')}[{i}]"
        if not isinstance(message, dict):
            raise TraceFormatError(f"{at}: expected an object with 'role' and 'content'")
        _get(message, "role", str, at)
        _get(message, "content", str, at)
    return [dict(m) for m in messages]


@dataclass
class CallUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0  # every generated token, thinking included
    latency_s: float = 0.0
    model: str = ""
    adapter: str | None = None
    finish_reason: str | None = None
    constrained: bool = False  # the backend applied the role's JSON schema (constrained decoding)
    # The sampling the call ran with; None in traces written before these were recorded.
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking; 0 in traces from before thinking
    prompt_tokens_dropped: int = 0  # prompt tokens left out to fit the context (`backend.truncate_prompt`)
    # max_tokens came inside the reasoning (`backend.reasoning_cap`: the answer was then forced, tokens included
    # here), and max_tokens was hit at all (finish_reason "length", or a forced answer's first call)
    reasoning_capped: bool = False
    length_capped: bool = False
    # stop strings that fired inside the reasoning and were written past (the model restated a tag while thinking)
    stops_in_reasoning: int = 0

    @classmethod
    def from_dict(cls, data: Any, where: str = "usage") -> CallUsage:
        if not isinstance(data, dict):
            raise TraceFormatError(f"{where}: expected an object")
        return cls(
            prompt_tokens=_get(data, "prompt_tokens", int, where),
            completion_tokens=_get(data, "completion_tokens", int, where),
            latency_s=_get(data, "latency_s", float, where),
            model=_get(data, "model", str, where, ""),
            adapter=_get(data, "adapter", str, where, None),
            finish_reason=_get(data, "finish_reason", str, where, None),
            constrained=bool(_get(data, "constrained", bool, where, None)),
            temperature=_get(data, "temperature", float, where, None),
            top_p=_get(data, "top_p", float, where, None),
            seed=_get(data, "seed", int, where, None),
            reasoning_tokens=_get(data, "reasoning_tokens", int, where, 0),
            prompt_tokens_dropped=_get(data, "prompt_tokens_dropped", int, where, 0),
            reasoning_capped=bool(_get(data, "reasoning_capped", bool, where, None)),
            length_capped=bool(_get(data, "length_capped", bool, where, None)),
            stops_in_reasoning=_get(data, "stops_in_reasoning", int, where, 0),
        )


@dataclass
class RoleCall:
    """One model call of one role: the prompt as sent, the raw output, and what was parsed from it."""

    role: str
    messages: list[dict[str, str]]  # exactly what went to the backend
    raw_text: str  # the completion text (thinking split out into `reasoning`)
    parsed: dict[str, Any]  # the role's output after parsing, or after its fallback when parse_ok is false
    parse_ok: bool  # the text held JSON that satisfied the role's schema
    usage: CallUsage = field(default_factory=CallUsage)
    reasoning: str | None = None
    parse_error: str | None = None  # why parsing failed, and which fallback produced `parsed`
    # The call's exact generated text (`Completion.generated`), for a method that continues the turn within the
    # question's run; not written to traces (`raw_text` and `reasoning` hold what was said).
    generated: str | None = field(default=None, repr=False, compare=False)
    # A privileged hint the prompt carried (teacher traces with `traces.hint`): text inside `messages`' last user
    # message that a student will not see, so its SFT row leaves it out. Written only when set.
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["generated"]
        if data["hint"] is None:
            del data["hint"]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "call") -> RoleCall:
        if not isinstance(data, dict):
            raise TraceFormatError(f"{where}: expected an object")
        return cls(
            role=_get(data, "role", str, where),
            messages=_messages(data, where),
            raw_text=_get(data, "raw_text", str, where),
            parsed=_get(data, "parsed", dict, where),
            parse_ok=_get(data, "parse_ok", bool, where),
            usage=CallUsage.from_dict(_get(data, "usage", dict, where), f"{where}.usage"),
            reasoning=_get(data, "reasoning", str, where, None),
            parse_error=_get(data, "parse_error", str, where, None),
            hint=_get(data, "hint", str, where, None),
        )


@dataclass
class SubQueryHits:
    query: str
    passage_ids: list[str]  # ranked, best first

    @classmethod
    def from_dict(cls, data: Any, where: str) -> SubQueryHits:
        if not isinstance(data, dict):
            raise TraceFormatError(f"{where}: expected an object")
        return cls(query=_get(data, "query", str, where), passage_ids=_str_list(data, "passage_ids", where))


# `RoundRecord.extra` key: the round's first search was the question text itself (MAPS `agent.search_question`),
# not a sub-query a writer wrote.
QUESTION_SEARCHED = "question_searched"


@dataclass
class RoundRecord:
    """One round (MAPS) or one turn (baselines): its calls in the order made, and its retrieval."""

    index: int  # 1-based
    calls: list[RoleCall] = field(default_factory=list)
    directions: list[str] = field(default_factory=list)
    sub_queries: list[str] = field(default_factory=list)
    retrieved: list[SubQueryHits] = field(default_factory=list)  # one per sub-query, same order
    evidence_ids: list[str] = field(default_factory=list)  # merged and deduplicated by passage id
    observation: str | None = None
    state: str | None = None  # the compressed reasoning state after this round
    sufficient: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific (baselines)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> RoundRecord:
        if not isinstance(data, dict):
            raise TraceFormatError(f"{where}: expected an object")
        calls = _get(data, "calls", list, where)
        retrieved = _get(data, "retrieved", list, where)
        return cls(
            index=_get(data, "index", int, where),
            calls=[RoleCall.from_dict(c, f"{where}.calls[{i}]") for i, c in enumerate(calls)],
            directions=_str_list(data, "directions", where),
            sub_queries=_str_list(data, "sub_queries", where),
            retrieved=[SubQueryHits.from_dict(r, f"{where}.retrieved[{i}]") for i, r in enumerate(retrieved)],
            evidence_ids=_str_list(data, "evidence_ids", where),
            observation=_get(data, "observation", str, where, None),
            state=_get(data, "state", str, where, None),
            sufficient=_get(data, "sufficient", bool, where, None),
            extra=_get(data, "extra", dict, where, {}) or {},
        )


@dataclass
class TraceRecord:
    question_id: str
    question: str
    dataset: str
    method: str
    config_digest: str
    rounds: list[RoundRecord]
    stop_reason: str  # MAPS: "sufficient" | "max_rounds"; baselines add their own (e.g. "answered")
    final_call: RoleCall | None  # the answer call (None for methods whose answer is not a separate call)
    final_answer: str
    golden_answers: list[str] = field(default_factory=list)
    options: list[str] | None = None
    parse_failures: dict[str, int] = field(default_factory=dict)  # role -> calls whose output took the fallback
    cost: Cost = field(default_factory=Cost)  # as in answers.jsonl
    # Batched searches the question took part in (see `AnswerRecord.retrieval_rounds`); None in older traces.
    retrieval_rounds: int | None = None
    # What each call contributed towards the gold passages and the answer (`records.credit`), computed when the trace
    # is written; None in traces written before it was recorded.
    credit: dict[str, Any] | None = None
    schema_version: int = TRACE_SCHEMA_VERSION

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def echoed_by(self, query: str) -> bool:
        """Whether `query` is this trace's question itself, equal after FlashRAG's answer normalisation: a
        "sub-query" that searches for the question, not a step of it."""
        return normalize_answer(query) == normalize_answer(self.question)

    def all_calls(self) -> list[RoleCall]:
        """Every role call in the order made, the final answer call last."""
        calls = [call for round_ in self.rounds for call in round_.calls]
        if self.final_call is not None:
            calls.append(self.final_call)
        return calls

    def answer_record(self) -> AnswerRecord:
        """This question's line of answers.jsonl (what evaluation reads): everything it needs is in the trace."""
        return AnswerRecord(
            question_id=self.question_id,
            answer=self.final_answer,
            method=self.method,
            dataset=self.dataset,
            rounds=self.num_rounds,
            retrieval_rounds=self.retrieval_rounds,
            stop_reason=self.stop_reason,
            cost=self.cost,
            parse_failures=dict(self.parse_failures),
            config_digest=self.config_digest,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cost"] = self.cost.to_dict()
        # Version first so a human reading the JSONL sees it at once.
        return {"schema_version": data.pop("schema_version"), **data}

    @classmethod
    def from_dict(cls, data: Any) -> TraceRecord:
        if not isinstance(data, dict):
            raise TraceFormatError("expected a JSON object (a trace record)")
        if "schema_version" not in data:
            raise TraceFormatError("schema_version: required field is missing (not a maps-train trace record?)")
        version = data["schema_version"]
        if version != TRACE_SCHEMA_VERSION:
            raise TraceFormatError(
                f"schema_version: {version!r} is not supported (this maps-train reads version {TRACE_SCHEMA_VERSION})"
            )
        rounds = _get(data, "rounds", list, "")
        final_call = _get(data, "final_call", dict, "", None)
        failures = _get(data, "parse_failures", dict, "", {}) or {}
        for role, count in failures.items():
            if not isinstance(count, int) or isinstance(count, bool):
                raise TraceFormatError(f"parse_failures.{role}: expected int, got {count!r}")
        options = _get(data, "options", list, "", None)
        return cls(
            question_id=_get(data, "question_id", str, ""),
            question=_get(data, "question", str, ""),
            dataset=_get(data, "dataset", str, ""),
            method=_get(data, "method", str, ""),
            config_digest=_get(data, "config_digest", str, ""),
            rounds=[RoundRecord.from_dict(r, f"rounds[{i}]") for i, r in enumerate(rounds)],
            stop_reason=_get(data, "stop_reason", str, ""),
            final_call=RoleCall.from_dict(final_call, "final_call") if final_call is not None else None,
            final_answer=_get(data, "final_answer", str, ""),
            golden_answers=_str_list(data, "golden_answers", "") if "golden_answers" in data else [],
            options=[str(o) for o in options] if options is not None else None,
            parse_failures=dict(failures),
            cost=Cost.from_dict(_get(data, "cost", dict, "", {}) or {}, "cost", TraceFormatError),
            retrieval_rounds=_get(data, "retrieval_rounds", int, "", None),
            credit=_get(data, "credit", dict, "", None),
            schema_version=version,
        )


def iter_traces(path: str | Path) -> Iterator[tuple[int, TraceRecord | TraceFormatError]]:
    """(line number, record or error) for every non-empty line of a traces file; never raises on content.

    The error's message is already prefixed with `file:line:`, ready to report or to skip. A torn last line
    (from a killed writer) is reported as an error too; the file is not modified.
    """
    path = Path(path)
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such traces file")
    for number, line, _ in iter_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield number, TraceRecord.from_dict(decode_object(line, where))
        except TraceFormatError as err:
            yield number, TraceFormatError(f"{where}: {err}")
        except MapsTrainError as err:  # not JSON, not UTF-8, not an object: already names the line
            yield number, TraceFormatError(str(err))


def restore_lost_answers(answers: KeyedJsonl, traces: KeyedJsonl, done: dict[Any, dict[str, Any]]) -> int:
    """Append the answer line of every trace in `traces` whose key `done` (the rows of `answers`) lacks; returns
    how many. A run appends a question's trace, then its answer line, so a kill between the two leaves a complete
    trace without its answer: the answer is rebuilt from that trace rather than the trace deleted and the question
    run again. `done` gains the restored rows. A torn last trace line is cut off first (the torn-line rule).
    """
    if not traces.path.exists():
        return 0
    restored = 0
    with answers:
        for number, row in read_records(traces.path, repair=True):
            key = traces.key_of(row, f"{traces.path}:{number}")
            if key in done:
                continue
            try:
                record = TraceRecord.from_dict(row).answer_record().to_dict()
            except TraceFormatError as err:
                raise TraceFormatError(f"{traces.path}:{number}: {err}") from None
            answers.append(record)
            done[key] = record
            restored += 1
    return restored
