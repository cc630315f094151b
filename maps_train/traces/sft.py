"""`maps-train sft-data`: teacher traces -> one SFT set per adapter, in TRL's conversational prompt-completion form.

A trace is kept when its final answer is right (Cover-EM; letter accuracy for multiple choice) and every role
output parsed; each kept role call becomes one row of the adapter that serves that role:

    {"prompt": [messages exactly as the teacher saw them], "completion": [{"role": "assistant", "content": raw}],
     "chat_template_kwargs": {"enable_thinking": false}, "question_id": ..., "role": ...}

`chat_template_kwargs` makes training render the same prompt vLLM renders at serving time. Rows over the length
caps and exact duplicates are dropped. Rejects are counted by reason; the statistics are printed and saved.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.recipe import Recipe, adapter_of_role
from maps_train.records.trace import RoleCall, TraceFormatError, TraceRecord, iter_traces

TRACES_FILE = "traces.jsonl"
STATS_FILE = "stats.json"


@dataclass
class SFTStats:
    traces: int = 0
    kept_traces: int = 0
    rejects: Counter = field(default_factory=Counter)  # reason -> traces (or rows, for row-level reasons)
    examples: Counter = field(default_factory=Counter)  # adapter -> rows
    prompt_tokens: Counter = field(default_factory=Counter)  # role -> tokens
    completion_tokens: Counter = field(default_factory=Counter)
    bad_lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "kept_traces": self.kept_traces,
            "rejects": dict(self.rejects),
            "examples": dict(self.examples),
            "prompt_tokens": dict(self.prompt_tokens),
            "completion_tokens": dict(self.completion_tokens),
            "bad_lines": self.bad_lines[:50],
        }

    def table(self) -> str:
        lines = [f"traces read: {self.traces}, kept: {self.kept_traces}",
                 "rejects: " + (", ".join(f"{k}={v}" for k, v in sorted(self.rejects.items())) or "none"),
                 "| adapter | examples |", "|---|---:|"]
        lines += [f"| {name} | {count} |" for name, count in sorted(self.examples.items())]
        lines += ["| role | prompt tokens | completion tokens |", "|---|---:|---:|"]
        lines += [f"| {role} | {self.prompt_tokens[role]} | {self.completion_tokens[role]} |"
                  for role in sorted(set(self.prompt_tokens) | set(self.completion_tokens))]
        return "\n".join(lines)


def trace_files(traces_dir: str | Path) -> list[Path]:
    root = Path(traces_dir)
    if root.is_file():
        return [root]
    files = sorted(root.rglob(TRACES_FILE))
    if not files:
        raise MapsTrainError(f"{root}: no {TRACES_FILE} found (run `maps-train traces RECIPE` first)")
    return files


def is_correct(trace: TraceRecord) -> bool:
    from maps_train.records.metrics import score_answer

    mode = "choice" if trace.options else "short"
    return score_answer(trace.final_answer, trace.golden_answers, mode, trace.options)["cover_em"] >= 1.0


def completion_text(call: RoleCall, enable_thinking: bool) -> str:
    """What the student learns to write: the teacher's raw output, with its thinking when thinking is on."""
    if enable_thinking and call.reasoning:
        return f"<think>\n{call.reasoning.strip()}\n</think>\n\n{call.raw_text}"
    return call.raw_text


class TokenCounter:
    """Counts prompt tokens as the chat template renders them, and completion tokens as plain text."""

    def __init__(self, name: str | None):
        self.tokenizer = None
        if name:
            from transformers import AutoTokenizer

            from maps_train.models.resolve import resolve_model

            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))

    def prompt(self, messages: list[dict[str, str]], kwargs: dict[str, Any]) -> int:
        if self.tokenizer is None:
            return sum(len(m["content"].split()) for m in messages)
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
        return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def completion(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def build_sft_sets(recipe: Recipe, *, traces_dir: str | None = None, out_dir: str | None = None,
                   skip_bad_lines: bool | None = None) -> SFTStats:
    config = recipe.sft_data
    skip = config.skip_bad_lines if skip_bad_lines is None else skip_bad_lines
    out = Path(out_dir or config.out_dir)
    role_to_adapter = adapter_of_role(recipe, shared=False)
    kwargs = {"enable_thinking": config.enable_thinking}
    counter = TokenCounter(config.tokenizer or recipe.train.student)
    stats = SFTStats()
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    seen: set[str] = set()

    for path in trace_files(traces_dir or config.traces_dir):
        for _, item in iter_traces(path):
            if isinstance(item, TraceFormatError):
                if not skip:
                    raise MapsTrainError(f"{item} (set sft_data.skip_bad_lines=true to skip bad lines)")
                stats.rejects["bad_line"] += 1
                stats.bad_lines.append(str(item))
                continue
            stats.traces += 1
            if config.require_correct and not is_correct(item):
                stats.rejects["incorrect_answer"] += 1
                continue
            calls = item.all_calls()
            if config.require_parsed and not all(call.parse_ok for call in calls):
                stats.rejects["parse_failure"] += 1
                continue
            stats.kept_traces += 1
            for call in calls:
                adapter = role_to_adapter.get(call.role)
                if adapter is None:
                    continue
                completion = completion_text(call, config.enable_thinking)
                if config.dedupe:
                    digest = hashlib.sha256(
                        json.dumps([adapter, call.messages, completion], sort_keys=True).encode()
                    ).hexdigest()
                    if digest in seen:
                        stats.rejects["duplicate_row"] += 1
                        continue
                    seen.add(digest)
                prompt_tokens = counter.prompt(call.messages, kwargs)
                completion_tokens = counter.completion(completion)
                if config.max_prompt_tokens is not None and prompt_tokens > config.max_prompt_tokens:
                    stats.rejects["prompt_too_long"] += 1
                    continue
                if config.max_completion_tokens is not None and completion_tokens > config.max_completion_tokens:
                    stats.rejects["completion_too_long"] += 1
                    continue
                rows[adapter].append({
                    "prompt": call.messages,
                    "completion": [{"role": "assistant", "content": completion}],
                    "chat_template_kwargs": kwargs,
                    "question_id": item.question_id,
                    "role": call.role,
                })
                stats.examples[adapter] += 1
                stats.prompt_tokens[call.role] += prompt_tokens
                stats.completion_tokens[call.role] += completion_tokens

    out.mkdir(parents=True, exist_ok=True)
    for adapter in config.adapter_roles:
        _write_jsonl(out / adapter / "train.jsonl", rows.get(adapter, []))
    _write_text(out / STATS_FILE, json.dumps(stats.to_dict(), indent=2) + "\n")
    return stats


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    _write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
