"""On-policy distillation (DAgger-style): the student runs MAPS, the teacher labels the states it reached.

Trained only on teacher traces, each role adapter sees states the teacher produced; at test time the student
meets its own directions, observations and compressed state, and its errors compound from there. Every MAPS role
call is a self-contained prompt built from (question, observations, state), so the teacher can answer the very
prompt the student saw. One iteration `i` (each step resumes; its data stays in `<out_dir>/iter-<i>/`):

1. `student/`: the current student (the student base plus the previous iteration's adapters, or the off-policy
   adapters for iteration 1) runs MAPS over the training questions (`run_method`: answers and traces).
2. `labels.jsonl`: each trained role call of the student's traces (all of them, or with `label: failed` only
   the calls whose student output did not parse, so the teacher's tokens go where the student is wrong) is sent
   to the teacher with exactly the student's messages and the role's JSON schema, in batches. One keyed line per
   call: the student's output, the teacher's, both parse results, the teacher's tokens and the verdict.
3. A label is kept when the teacher's output parses, for the answer role only when the teacher's answer is right
   (where the question has golds), and with `keep: divergent` only when the student's output failed or differs
   from the teacher's parsed output.
4. `sft/<adapter>/train.jsonl`: the kept labels as TRL prompt-completion rows (the student's prompt, the teacher's
   completion), mixed with `mix_ratio` off-policy rows per on-policy row drawn (seeded) from the teacher-trace
   SFT sets; `stats.json` counts labelled, kept and rejected rows per role and reason, and the teacher's tokens.
5. `adapters/`: the adapters retrained on that set (`train_all`, under `accelerate launch`).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.adapters import MANIFEST_FILE, AdapterSet, distilled_set, load_set, with_student_routes
from maps_train.agents.jsonparse import Parsed
from maps_train.agents.outputs import (
    answer_schema,
    consolidation_schema,
    directions_schema,
    option_letters,
    parse_answer,
    parse_consolidation,
    parse_directions,
    parse_query,
    query_schema,
)
from maps_train.errors import MapsTrainError
from maps_train.llm.types import ChatRequest, Completion
from maps_train.questions import Question
from maps_train.recipe import Recipe, adapter_of_role, sft_set_dir
from maps_train.records.metrics import score_answer
from maps_train.records.store import KeyedJsonl
from maps_train.records.trace import RoleCall, TraceRecord

LABELS_FILE = "labels.jsonl"
STATS_FILE = "stats.json"
MAPS_METHODS = ("maps",)  # the roles below are MAPS's; ablations change prompts and are not distilled on-policy


@dataclass
class RoleOutput:
    """What the teacher is asked for one call: the schema the role's call used and its parser."""

    schema: dict[str, Any]
    parse: Callable[[str], Parsed]


def role_output(call: RoleCall, trace: TraceRecord, direction: str | None, num_directions: int) -> RoleOutput | None:
    """The schema and parser of a MAPS role call, rebuilt from the trace (the engine's own functions)."""
    if call.role == "proposer":
        return RoleOutput(directions_schema(num_directions),
                          lambda text: parse_directions(text, num_directions, trace.question))
    if call.role == "writer":
        return RoleOutput(query_schema(), lambda text: parse_query(text, direction or trace.question))
    if call.role == "consolidator":
        return RoleOutput(consolidation_schema(), lambda text: parse_consolidation(text, "", ""))
    if call.role == "answer":
        letters = option_letters(len(trace.options)) if trace.options else None
        return RoleOutput(answer_schema(letters), lambda text: parse_answer(text, letters))
    return None


@dataclass
class LabelTask:
    """One student call to label: where it was, what the student saw and wrote, what the teacher must write."""

    question_id: str
    index: int  # the call's position in the question's trace (all_calls order)
    call: RoleCall
    output: RoleOutput
    golden_answers: list[str]
    options: list[str] | None

    @property
    def key(self) -> str:
        return f"{self.question_id}#{self.index}"


def label_tasks(traces: list[TraceRecord], roles: set[str], num_directions: int, only_failed: bool) -> list[LabelTask]:
    tasks = []
    for trace in traces:
        directions = iter([d for round_ in trace.rounds for d in round_.directions])
        for index, call in enumerate(trace.all_calls()):
            direction = next(directions, None) if call.role == "writer" else None
            if call.role not in roles or (only_failed and call.parse_ok):
                continue
            output = role_output(call, trace, direction, num_directions)
            if output is not None:
                tasks.append(LabelTask(trace.question_id, index, call, output, trace.golden_answers, trace.options))
    return tasks


def verdict(task: LabelTask, teacher: Parsed, keep_divergent_only: bool) -> str:
    """"kept", or why the label is not trained on."""
    if not teacher.ok:
        return "teacher_unparsed"
    if task.call.role == "answer" and task.golden_answers:
        mode = "choice" if task.options else "short"
        if score_answer(teacher.value["answer"], task.golden_answers, mode, task.options)["cover_em"] < 1.0:
            return "teacher_wrong"
    if keep_divergent_only and task.call.parse_ok and task.output.parse(task.call.raw_text).value == teacher.value:
        return "agrees"
    return "kept"


def label_record(task: LabelTask, completion: Completion, keep_divergent_only: bool) -> dict[str, Any]:
    teacher = task.output.parse(completion.text or "")
    return {
        "key": task.key,
        "question_id": task.question_id,
        "index": task.index,
        "role": task.call.role,
        "messages": task.call.messages,
        "student_text": task.call.raw_text,
        "student_ok": task.call.parse_ok,
        "teacher_text": completion.text or "",
        "teacher_reasoning": completion.reasoning,
        "teacher_ok": teacher.ok,
        "teacher_prompt_tokens": int(completion.prompt_tokens or 0),
        "teacher_completion_tokens": int(completion.completion_tokens or 0),
        "verdict": verdict(task, teacher, keep_divergent_only),
    }


def label_calls(
    tasks: list[LabelTask], teacher, labels: KeyedJsonl, batch_size: int, keep_divergent_only: bool,
    progress: bool = False,
) -> None:
    """Send every task not yet in `labels` to the teacher (a router over the teacher's routes) with exactly the
    student's messages and the role's schema, `batch_size` calls per backend call; append each label as it comes."""
    from tqdm.auto import tqdm

    done = set(labels.load())
    pending = [task for task in tasks if task.key not in done]
    with labels, tqdm(total=len(pending), desc="teacher labels", unit="call", disable=not progress) as bar:
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            requests = [ChatRequest(role=t.call.role, messages=t.call.messages, json_schema=t.output.schema,
                                    question_id=t.question_id) for t in chunk]
            for task, completion in zip(chunk, teacher.generate(requests)):
                labels.append(label_record(task, completion, keep_divergent_only))
            bar.update(len(chunk))


def sft_rows(labels: list[dict[str, Any]], enable_thinking: bool) -> list[dict[str, Any]]:
    """Kept labels as TRL conversational prompt-completion rows (the student's prompt, the teacher's completion)."""
    from maps_train.traces.sft import render_completion, sft_row

    return [
        {**sft_row(label["messages"], render_completion(label["teacher_text"], label.get("teacher_reasoning"),
                                                        enable_thinking),
                   enable_thinking, label["question_id"], label["role"]), "source": "on-policy"}
        for label in labels
        if label["verdict"] == "kept"
    ]


def read_rows(path: Path) -> list[dict[str, Any]]:
    from maps_train.jsonl import iter_jsonl

    return [row for _, row in iter_jsonl(path, "SFT file")] if path.is_file() else []


def mix(onpolicy: list[dict[str, Any]], offpolicy: list[dict[str, Any]], ratio: float, seed: int) -> list[dict]:
    """The on-policy rows plus `ratio` off-policy rows per on-policy row (as many as there are, at most), seeded.
    An adapter without on-policy rows (e.g. `label: failed` and a role the student never got wrong) keeps its
    whole off-policy set, so it retrains on what it was trained on."""
    wanted = min(len(offpolicy), round(ratio * len(onpolicy))) if onpolicy else len(offpolicy)
    drawn = random.Random(seed).sample(offpolicy, wanted) if wanted else []
    return onpolicy + [{**row, "source": row.get("source", "off-policy")} for row in drawn]


@dataclass
class IterationStats:
    iteration: int
    labelled: Counter = field(default_factory=Counter)  # role -> calls sent to the teacher
    verdicts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # role -> verdict -> rows
    rows: Counter = field(default_factory=Counter)  # adapter -> training rows (on-policy + off-policy)
    offpolicy_rows: Counter = field(default_factory=Counter)
    teacher_prompt_tokens: int = 0
    teacher_completion_tokens: int = 0
    student_parse_failures: Counter = field(default_factory=Counter)  # role -> failed calls in the student's run
    student_calls: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["verdicts"] = {role: dict(counts) for role, counts in self.verdicts.items()}
        return {key: dict(value) if isinstance(value, Counter) else value for key, value in data.items()}


def write_sft_sets(recipe: Recipe, labels: list[dict[str, Any]], out: Path, stats: IterationStats) -> Path:
    """The iteration's SFT sets, one folder per adapter, in the layout `maps-train train` reads."""
    config = recipe.onpolicy
    role_to_adapter = adapter_of_role(recipe, shared=False)
    by_adapter: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in sft_rows(labels, recipe.sft_data.enable_thinking):
        by_adapter[role_to_adapter[row["role"]]].append(row)
    from maps_train.traces.sft import write_jsonl

    sft_dir = out / "sft"
    for adapter in recipe.sft_data.adapter_roles:
        offpolicy = read_rows(sft_set_dir(recipe) / adapter / "train.jsonl")
        rows = mix(by_adapter[adapter], offpolicy, config.mix_ratio, config.seed + stats.iteration)
        stats.rows[adapter] = len(rows)
        stats.offpolicy_rows[adapter] = len(rows) - len(by_adapter[adapter])
        if not rows:
            raise MapsTrainError(f"{out}: no training rows for adapter '{adapter}' (no label kept and no off-policy "
                                 f"rows under {sft_set_dir(recipe) / adapter})")
        write_jsonl(sft_dir / adapter / "train.jsonl", rows)
    return sft_dir


def iteration_stats(iteration: int, traces: list[TraceRecord], labels: list[dict[str, Any]]) -> IterationStats:
    stats = IterationStats(iteration)
    for trace in traces:
        for call in trace.all_calls():
            stats.student_calls[call.role] += 1
            stats.student_parse_failures[call.role] += 0 if call.parse_ok else 1
    for label in labels:
        stats.labelled[label["role"]] += 1
        stats.verdicts[label["role"]][label["verdict"]] += 1
        stats.teacher_prompt_tokens += label["teacher_prompt_tokens"]
        stats.teacher_completion_tokens += label["teacher_completion_tokens"]
    return stats


def iteration_dir(recipe: Recipe, iteration: int) -> Path:
    return Path(recipe.onpolicy.out_dir) / f"iter-{iteration}"


def adapters_before(recipe: Recipe, iteration: int) -> AdapterSet:
    """The adapter set the student runs with in `iteration`: the previous iteration's, or the distilled
    (off-policy) one."""
    if iteration == 1:
        return distilled_set(recipe)
    return load_set(iteration_dir(recipe, iteration - 1) / "adapters", recipe)


def student_recipe(recipe: Recipe, adapters: AdapterSet) -> Recipe:
    """The recipe whose routes are the student's with `adapters` (an in-process vLLM engine)."""
    return with_student_routes(recipe, adapters, via="engine")


def record_parent(folder: Path, parent: AdapterSet) -> None:
    """Name the set an iteration's adapters were retrained from in their manifest's lineage (`parent`)."""
    if (folder / MANIFEST_FILE).is_file():
        retrained = AdapterSet.read_manifest(folder / MANIFEST_FILE)
        lineage = {**retrained.lineage, "parent": str(parent.root), "stage": "onpolicy"}
        dataclasses.replace(retrained, lineage=lineage).write()


def teacher_router(recipe: Recipe):
    from maps_train.llm.router import build_router

    return build_router(recipe)


def load_training_questions(recipe: Recipe) -> list[Question]:
    from maps_train.questions import load_questions

    files = recipe.onpolicy.questions or recipe.traces.questions
    questions: list[Question] = []
    for path in files:
        questions += load_questions(path, limit=recipe.onpolicy.limit)
    return questions


def run_iteration(
    recipe: Recipe,
    iteration: int,
    *,
    student_backend=None,
    teacher=None,
    retriever=None,
    train: Callable[[Path, Path], Any] | None = None,
    progress: bool = True,
) -> IterationStats:
    """One on-policy iteration (every step resumes); returns its statistics (also written to stats.json).

    `student_backend` (the student's routes) and `teacher` (a backend over the recipe's own, the teacher's,
    routes) and `retriever` default to what the recipe builds; the student's engine is closed before the
    teacher's starts, so a node holds one model at a time. `train(sft_dir, adapters_dir)` retrains the adapters
    (`maps-train distill-on-policy` passes `train_all` under `accelerate launch`).
    """
    from maps_train.agents.runner import run_method
    from maps_train.records.trace import iter_traces
    from maps_train.runlock import sole_writer

    if recipe.agent.method not in MAPS_METHODS:
        raise MapsTrainError(f"agent.method: on-policy distillation trains MAPS roles; got '{recipe.agent.method}'")
    out = iteration_dir(recipe, iteration)
    # One writer per iteration folder: two would label every call twice and train on the mix.
    with sole_writer(out, "maps-train distill-on-policy"):
        questions = load_training_questions(recipe)
        before = adapters_before(recipe, iteration)
        run_method(student_recipe(recipe, before), questions, out / "student", backend=student_backend,
                   retriever=retriever, progress=progress)
        traces = [t for _, t in iter_traces(out / "student" / "traces.jsonl") if isinstance(t, TraceRecord)]

        roles = set(adapter_of_role(recipe, shared=False))
        tasks = label_tasks(traces, roles, recipe.agent.num_directions, recipe.onpolicy.label == "failed")
        built = teacher is None
        teacher = teacher or teacher_router(recipe)
        try:
            label_calls(tasks, teacher, KeyedJsonl(out / LABELS_FILE, key="key"), recipe.onpolicy.batch_size,
                        recipe.onpolicy.keep == "divergent", progress)
        finally:
            if built:
                teacher.close()
        wanted = {task.key for task in tasks}
        labels = [row for key, row in KeyedJsonl(out / LABELS_FILE, key="key").load().items() if key in wanted]

        stats = iteration_stats(iteration, traces, labels)
        sft_dir = write_sft_sets(recipe, labels, out, stats)
        (out / STATS_FILE).write_text(json.dumps(stats.to_dict(), indent=1) + "\n", encoding="utf-8")
        if train is not None:
            train(sft_dir, out / "adapters")
            record_parent(out / "adapters", before)
        return stats


def markdown(stats: list[IterationStats]) -> str:
    """Per iteration and role: student parse failures, calls labelled, kept and rejected by reason; teacher tokens."""
    reasons = sorted({v for s in stats for counts in s.verdicts.values() for v in counts} - {"kept"})
    lines = ["| iteration | role | student calls | student parse failures | labelled | kept | "
             + " | ".join(reasons) + " |", "|---:|---|---:|---:|---:|---:|" + "---:|" * len(reasons)]
    for s in stats:
        for role in sorted(s.student_calls):
            counts = s.verdicts.get(role, Counter())
            lines.append(f"| {s.iteration} | {role} | {s.student_calls[role]} | {s.student_parse_failures[role]} | "
                         f"{s.labelled[role]} | {counts['kept']} | " + " | ".join(str(counts[r]) for r in reasons)
                         + " |")
    lines += ["", "| iteration | teacher prompt tokens | teacher completion tokens | training rows (off-policy) |",
              "|---:|---:|---:|---|"]
    for s in stats:
        rows = ", ".join(f"{a}: {n} ({s.offpolicy_rows[a]})" for a, n in sorted(s.rows.items()))
        lines.append(f"| {s.iteration} | {s.teacher_prompt_tokens} | {s.teacher_completion_tokens} | {rows} |")
    return "\n".join(lines)
