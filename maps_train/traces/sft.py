"""`maps-train sft-data`: teacher traces -> one SFT set per adapter, in TRL's conversational prompt-completion form.

Rejection sampling over the samples `maps-train traces` wrote (`<traces>/<file>/sample-<k>/traces.jsonl`, read in
sample order). A sample (one question's trace) is kept when:

1. its final answer is right (`require_correct`: Cover-EM for short answers, the letter for multiple choice,
   `maps_train.records.metrics.score_answer`), else rejected as `incorrect`;
2. every role output parsed (`require_parsed`), else `unparsed`;
3. fewer than `max_samples_per_question` samples of its question were kept before it, else `over_cap`;
4. it adds something (`dedupe`): a role call whose (role, prompt messages, completion) an earlier kept call gave
   is a `duplicate` row, and a sample made only of duplicates is rejected whole (it does not count against the cap).

Each kept role call becomes one row of the adapter that serves that role, unless it is over a length cap
(`prompt_too_long`, `completion_too_long`) or longer than `train.sft.max_length` as the student's chat template
renders prompt and completion together (`over_max_length`, see `SFTSetBuilder.fits_max_length`):

    {"prompt": [messages as the teacher saw them, less any hint], "completion": [{"role": "assistant", "content": raw}],
     "chat_template_kwargs": {"enable_thinking": false}, "question_id": ..., "role": ...}

With `sft_data.filter: role` the samples are not judged whole: each call's row is kept by its own credit
(`records.credit`, recorded in the trace), so one bad call does not cost a question its good ones and a lucky answer
does not carry its bad calls (rejection sampling per role, `credit_verdict`):

- writer and proposer rows whose sub-queries found gold no earlier search of the question had (`new_gold`;
  dropped as `no_new_gold`);
- consolidator rows whose stop-or-continue was right: stop with the gold complete, go on with it incomplete when the
  later rounds found more (`right_decision`; dropped as `wrong_decision`);
- answer rows whose F1 is at least `sft_data.min_answer_f1` (`answer_f1`; dropped as `wrong_answer`);
- with `sft_data.drop_question_echo`, a writer row whose sub-query is the question itself (`question_echo`);
- with `require_parsed`, a call whose own output did not parse is dropped (`unparsed`); a question without gold
  passages cannot judge the search and stop rows (`no_gold`), and a trace written without credit none (`no_credit`).

The cap counts a sample as kept when one of its rows was. `stats.json`'s `credit_rules` counts, per rule and role,
the rows kept and dropped.

A floor per role (`sft_data.min_rows_per_role`): a role left with fewer kept rows than that keeps none
(`below_floor` in `stats.json`, per role). A handful of rows teaches a constant, not a skill: the learning study's
few answer rows that passed F1 >= 0.5, mostly "yes" to comparison questions, made its distilled agent answer
"yes" to most dev questions (docs/learning-study.md). The role's adapter then trains without it (`maps-train train` records the rows per role
as `rows_per_role` in the adapter's `train_summary.json`) and the distilled routes send the role to the base model
(`maps_train.adapters.AdapterSet.routes`); an adapter left with no row at all is not trained
(`maps_train.train.unlearned`).

`chat_template_kwargs` makes training render the same prompt vLLM renders at serving time. Rows are message lists,
not rendered text: each student's chat template renders them when it trains, so every student of a teacher reads
the same set (by default `<traces>/sft/<hash of the row settings>/`, `maps_train.recipe.sft_set_dir`; the
tokenizer counts only when token caps are set). With `sft_data.eval_fraction` > 0, a seeded share of the kept
questions goes to `<adapter>/eval.jsonl` instead, every row of such a question in every adapter, so no question
is trained on and evaluated. The statistics
(printed, and saved as `<out_dir>/stats.json`) count rejected samples by reason (`rejects`: `incorrect_answer`,
`parse_failure`, `over_cap`, `duplicate_sample`, `bad_line`; and rows: `duplicate_row`, `prompt_too_long`,
`completion_too_long`, `over_max_length`), and per role the rows kept and rejected by reason (`rows`: role ->
reason -> count, with `kept`; a rejected sample's calls count under its reason).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.agents.outputs import as_deployed_json
from maps_train.errors import MapsTrainError
from maps_train.library_options import SFTOptions
from maps_train.paths import write_text_atomic
from maps_train.recipe import Recipe, adapter_of_role, sft_set_dir, sft_set_settings, sft_traces_dir
from maps_train.records.credit import call_credits, has_gold
from maps_train.records.hints import student_messages
from maps_train.records.shards import in_shard_folder
from maps_train.records.trace import RoleCall, TraceFormatError, TraceRecord, iter_traces

TRACES_FILE = "traces.jsonl"
STATS_FILE = "stats.json"
SETTINGS_FILE = "settings.json"  # what the set's rows depend on (the folder name's hash is of this)


@dataclass
class SFTStats:
    traces: int = 0
    kept_traces: int = 0
    rejects: Counter = field(default_factory=Counter)  # reason -> samples (or rows, for row-level reasons)
    examples: Counter = field(default_factory=Counter)  # adapter -> rows
    eval_examples: Counter = field(default_factory=Counter)  # adapter -> rows of those held out (eval.jsonl)
    eval_questions: int = 0
    rows: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # role -> reason|"kept" -> rows
    prompt_tokens: Counter = field(default_factory=Counter)  # role -> tokens
    completion_tokens: Counter = field(default_factory=Counter)
    bad_lines: list[str] = field(default_factory=list)
    # filter "role": rule -> role -> "kept" | "dropped" -> rows
    credit_rules: dict[str, dict[str, Counter]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(Counter)))
    below_floor: Counter = field(default_factory=Counter)  # role -> rows dropped under sft_data.min_rows_per_role

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "kept_traces": self.kept_traces,
            "rejects": dict(self.rejects),
            "examples": dict(self.examples),
            "eval_examples": dict(self.eval_examples),
            "eval_questions": self.eval_questions,
            "rows": {role: dict(counts) for role, counts in sorted(self.rows.items())},
            "prompt_tokens": dict(self.prompt_tokens),
            "completion_tokens": dict(self.completion_tokens),
            "bad_lines": self.bad_lines[:50],
            "credit_rules": {rule: {role: dict(counts) for role, counts in sorted(roles.items())}
                             for rule, roles in sorted(self.credit_rules.items())},
            "below_floor": dict(self.below_floor),
        }

    def table(self) -> str:
        lines = [f"traces read: {self.traces}, kept: {self.kept_traces}",
                 "rejects: " + (", ".join(f"{k}={v}" for k, v in sorted(self.rejects.items())) or "none"),
                 f"held out for eval: {self.eval_questions} questions",
                 "| adapter | examples | of them eval |", "|---|---:|---:|"]
        lines += [f"| {name} | {count} | {self.eval_examples[name]} |" for name, count in sorted(self.examples.items())]
        reasons = sorted({reason for counts in self.rows.values() for reason in counts} - {KEPT})
        lines += ["| role | kept rows |" + "".join(f" {r} |" for r in reasons), "|---|---:|" + "---:|" * len(reasons)]
        lines += [f"| {role} | {counts[KEPT]} |" + "".join(f" {counts[r]} |" for r in reasons)
                  for role, counts in sorted(self.rows.items())]
        if self.credit_rules:
            lines += ["| credit rule | role | kept | dropped |", "|---|---|---:|---:|"]
            lines += [f"| {rule} | {role} | {counts['kept']} | {counts['dropped']} |"
                      for rule, roles in sorted(self.credit_rules.items()) for role, counts in sorted(roles.items())]
        if self.below_floor:
            lines.append("below sft_data.min_rows_per_role (no rows kept; served by the base model): " + ", ".join(
                f"{role} ({rows} row{'' if rows == 1 else 's'})" for role, rows in sorted(self.below_floor.items())))
        lines += ["| role | prompt tokens | completion tokens |", "|---|---:|---:|"]
        lines += [f"| {role} | {self.prompt_tokens[role]} | {self.completion_tokens[role]} |"
                  for role in sorted(set(self.prompt_tokens) | set(self.completion_tokens))]
        return "\n".join(lines)


def trace_files(traces_dir: str | Path) -> list[Path]:
    """Every traces file under `traces_dir`, samples in numeric order (sample-2 before sample-10): the cap on
    samples per question keeps the earliest."""
    root = Path(traces_dir)
    if root.is_file():
        return [root]
    # Shard folders (`--shard`) are read once merged into the run's own folders, not twice.
    files = sorted((p for p in root.rglob(TRACES_FILE) if not in_shard_folder(p, root)), key=_natural_key)
    if not files:
        raise MapsTrainError(f"{root}: no {TRACES_FILE} found (run `maps-train traces RECIPE` first)")
    return files


def _natural_key(path: Path) -> list[Any]:
    # re.split with a group alternates text and digit runs, so the keys of two paths compare position by position
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def is_correct(trace: TraceRecord) -> bool:
    from maps_train.records.metrics import score_answer

    mode = "choice" if trace.options else "short"
    return score_answer(trace.final_answer, trace.golden_answers, mode, trace.options)["cover_em"] >= 1.0


def render_completion(text: str, reasoning: str | None, enable_thinking: bool) -> str:
    """What the student learns to write: the teacher's output, with its thinking when thinking is on. An output
    that is one JSON object is written as the student's deployed decoding writes it (`as_deployed_json`), whoever
    the teacher was: a served model without that grammar, or the annotation teacher of older traces, put spaces
    after `:` and `,` that the student's grammar never lets it produce."""
    text = as_deployed_json(text)
    if enable_thinking and reasoning:
        return f"<think>\n{reasoning.strip()}\n</think>\n\n{text}"
    return text


def completion_text(call: RoleCall, enable_thinking: bool) -> str:
    return render_completion(call.raw_text, call.reasoning, enable_thinking)


def sft_row(messages: list[dict[str, str]], completion: str, enable_thinking: bool, question_id: str,
            role: str) -> dict[str, Any]:
    """One TRL conversational prompt-completion row; `chat_template_kwargs` makes training render the prompt the
    way vLLM renders it at serving time."""
    return {
        "prompt": messages,
        "completion": [{"role": "assistant", "content": completion}],
        "chat_template_kwargs": {"enable_thinking": enable_thinking},
        "question_id": question_id,
        "role": role,
    }


class TokenCounter:
    """Counts prompt tokens as the chat template renders them, and completion tokens as plain text."""

    def __init__(self, name: str | None):
        self.name = name  # None: words, not tokens
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

    def row(self, messages: list[dict[str, str]], completion: str, kwargs: dict[str, Any]) -> int | None:
        """Tokens of the whole row as TRL's SFTTrainer tokenizes a conversational prompt-completion row: prompt and
        completion rendered together by the chat template (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        conversation = [*messages, {"role": "assistant", "content": completion}]
        ids = self.tokenizer.apply_chat_template(conversation, tokenize=True, **kwargs)
        return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


KEPT = "kept"
BELOW_FLOOR = "below_floor"  # a kept row of a role with fewer than sft_data.min_rows_per_role rows
OVER_MAX_LENGTH = "over_max_length"  # a row TRL would cut at train.sft.max_length (its completion with it)
# A rejected sample's reason: (the `rejects` key, counted per sample; the `rows` key its calls count under)
INCORRECT = ("incorrect_answer", "incorrect")
UNPARSED = ("parse_failure", "unparsed")
OVER_CAP = ("over_cap", "over_cap")
DUPLICATE = ("duplicate_sample", "duplicate")
QUESTION_ECHO = "question_echo"  # sft_data.drop_question_echo: a writer row whose sub-query is the question


class SFTSetBuilder:
    """Rejection sampling over traces, one at a time and in sample order; rows accumulate per adapter."""

    def __init__(self, recipe: Recipe):
        self.config = recipe.sft_data
        self.role_to_adapter = adapter_of_role(recipe, shared=False)
        self.kwargs = {"enable_thinking": self.config.enable_thinking}
        self.counter = TokenCounter(self.config.tokenizer or recipe.train.student)
        self.max_length = SFTOptions.of(recipe.train.sft).max_length  # TRL cuts longer rows from the end: the completion
        self.stats = SFTStats()
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.row_questions: dict[str, list[tuple[str, str]]] = defaultdict(list)  # beside rows: each row's question
        self.row_tokens: dict[str, list[tuple[int, int]]] = defaultdict(list)  # beside rows: prompt, completion
        self.seen: set[str] = set()  # digests of the (role, prompt, completion) rows kept so far
        self.kept_per_question: Counter = Counter()

    def add(self, trace: TraceRecord) -> None:
        self.stats.traces += 1
        if self.config.filter == "role":
            self._add_by_role(trace)
            return
        calls = [call for call in trace.all_calls() if call.role in self.role_to_adapter]  # the trained roles
        reason = self._rejection(trace, calls)
        if reason is not None:
            self.stats.rejects[reason[0]] += 1
            for call in calls:
                self.stats.rows[call.role][reason[1]] += 1
            return
        self.stats.kept_traces += 1
        self.kept_per_question[_question_key(trace)] += 1
        for call in calls:
            self._add_row(trace, call)

    def _add_by_role(self, trace: TraceRecord) -> None:
        """Rejection sampling per call, by its credit (see the module docstring)."""
        config, key = self.config, _question_key(trace)
        credits = [(call, entry) for call, entry in call_credits(trace) if call.role in self.role_to_adapter]
        cap = config.max_samples_per_question
        if cap is not None and self.kept_per_question[key] >= cap:
            self.stats.rejects[OVER_CAP[0]] += 1
            for call, _ in credits:
                self.stats.rows[call.role][OVER_CAP[1]] += 1
            return
        passed, gold_known = [], has_gold(trace)
        for call, entry in credits:
            rule, reason = credit_verdict(call, entry, config.min_answer_f1, config.require_parsed, gold_known)
            self.stats.credit_rules[rule][call.role]["dropped" if reason else "kept"] += 1
            if reason:
                self.stats.rejects[reason] += 1
                self.stats.rows[call.role][reason] += 1
            else:
                passed.append(call)
        if not passed:
            return
        self.stats.kept_traces += 1
        self.kept_per_question[key] += 1
        for call in passed:
            self._add_row(trace, call)

    def _rejection(self, trace: TraceRecord, calls: list[RoleCall]) -> tuple[str, str] | None:
        config = self.config
        if config.require_correct and not is_correct(trace):
            return INCORRECT
        if config.require_parsed and not all(call.parse_ok for call in trace.all_calls()):
            return UNPARSED
        if config.dedupe and calls and all(self._digest(call) in self.seen for call in calls):
            return DUPLICATE  # before the cap: a copy of a kept sample is a duplicate whether or not the cap is full
        cap = config.max_samples_per_question
        if cap is not None and self.kept_per_question[_question_key(trace)] >= cap:
            return OVER_CAP
        return None

    def _digest(self, call: RoleCall) -> str:
        completion = completion_text(call, self.config.enable_thinking)
        messages = student_messages(call)
        return hashlib.sha256(json.dumps([call.role, messages, completion], sort_keys=True).encode()).hexdigest()

    def _add_row(self, trace: TraceRecord, call: RoleCall) -> None:
        config, counts = self.config, self.stats.rows[call.role]
        if config.drop_question_echo and echoes_question(trace, call):
            self.stats.rejects[QUESTION_ECHO] += 1
            counts[QUESTION_ECHO] += 1
            return
        if config.dedupe:
            digest = self._digest(call)
            if digest in self.seen:
                self.stats.rejects["duplicate_row"] += 1
                counts["duplicate"] += 1
                return
            self.seen.add(digest)
        completion = completion_text(call, config.enable_thinking)
        messages = student_messages(call, f"question {trace.question_id}")  # a teacher's hint left out
        prompt_tokens = self.counter.prompt(messages, self.kwargs)
        completion_tokens = self.counter.completion(completion)
        too_long = None
        if config.max_prompt_tokens is not None and prompt_tokens > config.max_prompt_tokens:
            too_long = "prompt_too_long"
        elif config.max_completion_tokens is not None and completion_tokens > config.max_completion_tokens:
            too_long = "completion_too_long"
        elif not self.fits_max_length(messages, completion):
            too_long = OVER_MAX_LENGTH
        if too_long is not None:
            self.stats.rejects[too_long] += 1
            counts[too_long] += 1
            return
        adapter = self.role_to_adapter[call.role]
        self.rows[adapter].append(
            sft_row(messages, completion, config.enable_thinking, trace.question_id, call.role)
        )
        self.row_questions[adapter].append(_question_key(trace))
        self.row_tokens[adapter].append((prompt_tokens, completion_tokens))
        counts[KEPT] += 1
        self.stats.examples[adapter] += 1
        self.stats.prompt_tokens[call.role] += prompt_tokens
        self.stats.completion_tokens[call.role] += completion_tokens


    def apply_floor(self, floor: int) -> None:
        """Drop every row of a role with fewer than `floor` kept rows (`sft_data.min_rows_per_role`)."""
        thin = {role for role, counts in self.stats.rows.items() if 0 < counts[KEPT] < floor}
        for adapter in list(self.rows):
            columns = list(zip(self.rows[adapter], self.row_questions[adapter], self.row_tokens[adapter]))
            for row, _, (prompt, completion) in columns:
                role = row["role"]
                if role in thin:
                    self.stats.below_floor[role] += 1
                    self.stats.rows[role][KEPT] -= 1
                    self.stats.rows[role][BELOW_FLOOR] += 1
                    self.stats.examples[adapter] -= 1
                    self.stats.prompt_tokens[role] -= prompt
                    self.stats.completion_tokens[role] -= completion
            kept = [column for column in columns if column[0]["role"] not in thin]
            self.rows[adapter], self.row_questions[adapter], self.row_tokens[adapter] = (
                [list(part) for part in zip(*kept)] if kept else ([], [], []))

    def fits_max_length(self, messages: list[dict[str, str]], completion: str) -> bool:
        """Whether TRL keeps the whole row: it cuts a row over `train.sft.max_length` from the end, which is the
        completion, the very part the adapter learns. Such a row is dropped, not shortened: a prompt with evidence
        or observations left out is one the teacher never answered, so its completion would teach the student to
        cite what it cannot see (and a trace row does not say where its pieces begin and end)."""
        if self.max_length is None:
            return True
        length = self.counter.row(messages, completion, self.kwargs)
        return length is None or length <= self.max_length


def echoes_question(trace: TraceRecord, call: RoleCall) -> bool:
    """Whether `call` is a writer call whose sub-query is the question, equal after FlashRAG's normalisation."""
    query = call.parsed.get("query") if call.role == "writer" and isinstance(call.parsed, dict) else None
    return isinstance(query, str) and trace.echoed_by(query)


def credit_verdict(call: RoleCall, entry: dict[str, Any] | None, min_answer_f1: float, require_parsed: bool,
                   gold_known: bool) -> tuple[str, str | None]:
    """(the rule that judges `call`'s row, the reason it is dropped or None when kept) by the call's credit."""
    rule = {"writer": "new_gold", "proposer": "new_gold", "consolidator": "right_decision",
            "answer": "answer_f1"}.get(call.role, "no_rule")
    if require_parsed and not call.parse_ok:
        return rule, "unparsed"
    if rule == "no_rule":
        return rule, None
    if entry is None:
        return rule, "no_credit"
    if rule == "answer_f1":
        return rule, None if float(entry.get("f1", 0.0)) >= min_answer_f1 else "wrong_answer"
    if not gold_known:
        return rule, "no_gold"
    if rule == "new_gold":
        return rule, None if int(entry.get("new", 0)) > 0 else "no_new_gold"
    return rule, None if entry.get("right") is True else "wrong_decision"


def _question_key(trace: TraceRecord) -> tuple[str, str]:
    # The id and the text: two questions files may reuse an id for different questions.
    return trace.question_id, trace.question


def eval_questions(keys: set[tuple[str, str]], fraction: float, seed: int) -> set[tuple[str, str]]:
    """The held-out questions: `fraction` of `keys` (rounded, at least one while one is left to train on), picked by
    a seeded shuffle of the sorted keys, so the same kept questions give the same split on any machine."""
    if fraction <= 0 or len(keys) < 2:
        return set()
    ordered = sorted(keys)
    random.Random(seed).shuffle(ordered)
    count = min(max(1, round(fraction * len(ordered))), len(ordered) - 1)
    return set(ordered[:count])


def build_sft_sets(recipe: Recipe, *, traces_dir: str | None = None, out_dir: str | None = None,
                   skip_bad_lines: bool | None = None) -> SFTStats:
    config = recipe.sft_data
    skip = config.skip_bad_lines if skip_bad_lines is None else skip_bad_lines
    out = Path(out_dir) if out_dir else sft_set_dir(recipe)
    builder = SFTSetBuilder(recipe)
    stats = builder.stats
    for path in trace_files(traces_dir or sft_traces_dir(recipe)):
        for _, item in iter_traces(path):
            if isinstance(item, TraceFormatError):
                if not skip:
                    raise MapsTrainError(f"{item} (set sft_data.skip_bad_lines=true to skip bad lines)")
                stats.rejects["bad_line"] += 1
                stats.bad_lines.append(str(item))
                continue
            builder.add(item)

    if config.min_rows_per_role:
        builder.apply_floor(config.min_rows_per_role)
    held_out = eval_questions({key for keys in builder.row_questions.values() for key in keys},
                              config.eval_fraction, config.eval_seed)
    stats.eval_questions = len(held_out)
    out.mkdir(parents=True, exist_ok=True)
    for adapter in config.adapter_roles:
        rows, keys = builder.rows.get(adapter, []), builder.row_questions.get(adapter, [])
        write_jsonl(out / adapter / "train.jsonl", [row for row, key in zip(rows, keys) if key not in held_out])
        evaluation = [row for row, key in zip(rows, keys) if key in held_out]
        stats.eval_examples[adapter] = len(evaluation)
        if held_out:
            write_jsonl(out / adapter / "eval.jsonl", evaluation)
        else:
            (out / adapter / "eval.jsonl").unlink(missing_ok=True)  # a stale split would be trained against
    settings = {**sft_set_settings(recipe), "token_counts_by": builder.counter.name}
    write_text_atomic(out / SETTINGS_FILE, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    write_text_atomic(out / STATS_FILE, json.dumps(stats.to_dict(), indent=2) + "\n")
    return stats


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
