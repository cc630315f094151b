"""Sub-queries against the question's own search: where a run's gold passages come from, and which it misses.

The learning study's distilled agent trails Vanilla RAG on evidence recall (docs/learning-study.md). Vanilla RAG
searches the question itself once. This analysis reads a run's traces and, optionally, a reference run's traces on
the same questions (Vanilla RAG's), and reports:

- per run, over the questions that name gold passages: searches per question; distinct directions per round that
  had a proposer (the parser drops repeated ones, so a proposer that wrote one entity three times searched once);
  words per sub-query; the share of questions where some sub-query echoes the question (equal after normalisation;
  with MAPS's `agent.search_question`, the question's own search is neither a sub-query nor an echo);
  evidence recall (`credit.found / credit.gold`), over all questions and split by echo;
- against the reference, question by question (matched by data set and id): the gold passages both found, those
  only the run found and those only the reference found, and both recalls split by whether the run echoed.

It reads only the traces' own records (`rounds[].retrieved`, `credit`), so it runs on any finished run with no
retriever. A trace without credit (written before credit was recorded) is counted under `no credit` and skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.analysis.trace_reader import iter_valid_traces, written_queries
from maps_train.errors import MapsTrainError
from maps_train.records.trace import TraceRecord


@dataclass(frozen=True)
class QuestionSearch:
    """What one question's run searched and found."""

    queries: tuple[str, ...]  # every search, in order (MAPS's `agent.search_question` search of the question too)
    written: tuple[str, ...]  # the searches a model wrote: `queries` less that question search
    gold: int  # the question's gold passages
    found: frozenset[int]  # indices of the gold passages some search found
    echoed: bool  # some written sub-query equals the question after normalisation
    directions: tuple[int, ...]  # distinct directions of each round that had them


def traces_files(path: str | Path) -> list[Path]:
    """`path` itself when it is a file, else every traces.jsonl under it (an eval system's folder), sorted."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.rglob("traces.jsonl")) if path.is_dir() else []
    if not files:
        raise MapsTrainError(f"{path}: no traces file (a traces.jsonl, or a folder that holds some)")
    return files


def question_search(trace: TraceRecord) -> QuestionSearch | None:
    """The question's searches and gold found, or None when its trace has no credit or the question no gold."""
    credit = trace.credit
    if not credit or not int(credit.get("gold", 0)):
        return None
    queries = tuple(hits.query for round_ in trace.rounds for hits in round_.retrieved)
    written = tuple(query for round_ in trace.rounds for query in written_queries(round_))
    found = frozenset(i for entry in credit.get("queries", []) for i in entry.get("gold", []))
    directions = tuple(len(round_.directions) for round_ in trace.rounds if round_.directions)
    return QuestionSearch(queries, written, int(credit["gold"]), found,
                          any(trace.echoed_by(q) for q in written), directions)


def read_searches(path: str | Path) -> tuple[dict[tuple[str, str], QuestionSearch], int]:
    """(data set, question id) -> the question's searches, for every credited trace with gold under `path`; and how
    many traces had no credit. A malformed line is an error naming it. A question with several traces (k sampled
    teacher runs, `sample-0`, `sample-1`, ...) counts once, by its first trace in file order, and a warning says how
    many were set aside, so no figure mixes one question's samples unsaid."""
    searches: dict[tuple[str, str], QuestionSearch] = {}
    uncredited = repeated = 0
    for file in traces_files(path):
        for trace in iter_valid_traces(file):
            if trace.credit is None:
                uncredited += 1
                continue
            search = question_search(trace)
            if search is None:
                continue
            if (trace.dataset, trace.question_id) in searches:
                repeated += 1
                continue
            searches[(trace.dataset, trace.question_id)] = search
    if repeated:
        print(f"maps-train: warning: {path}: {repeated} more traces of questions already read (several samples a "
              f"question); each question counts once, by its first trace", file=sys.stderr)
    return searches, uncredited


def _recall(searches: Iterable[QuestionSearch]) -> float | None:
    searches = list(searches)
    return sum(len(s.found) / s.gold for s in searches) / len(searches) if searches else None


def run_summary(searches: dict[tuple[str, str], QuestionSearch], uncredited: int = 0) -> dict[str, Any]:
    """The per-run figures of the module docstring."""
    rows = list(searches.values())
    queries = [q for s in rows for q in s.queries]
    written = [q for s in rows for q in s.written]
    directions = [n for s in rows for n in s.directions]
    echoed = [s for s in rows if s.echoed]
    return {
        "questions": len(rows),
        "no_credit": uncredited,
        "searches_per_question": len(queries) / len(rows) if rows else None,
        "directions_per_round": sum(directions) / len(directions) if directions else None,
        "words_per_query": sum(len(q.split()) for q in written) / len(written) if written else None,
        "echo_share": len(echoed) / len(rows) if rows else None,
        "recall": _recall(rows),
        "recall_echo": _recall(echoed),
        "recall_no_echo": _recall(s for s in rows if not s.echoed),
    }


def against_summary(run: dict[tuple[str, str], QuestionSearch],
                    reference: dict[tuple[str, str], QuestionSearch]) -> dict[str, Any]:
    """Question by question on the questions both runs have: gold found by both, by the run only, by the reference
    only; both recalls, split by whether the run echoed the question."""
    shared = sorted(run.keys() & reference.keys())
    both = run_only = reference_only = gold = 0
    for key in shared:
        mine, theirs = run[key].found, reference[key].found
        both += len(mine & theirs)
        run_only += len(mine - theirs)
        reference_only += len(theirs - mine)
        gold += run[key].gold
    split: dict[str, Any] = {"questions": len(shared), "gold": gold, "both": both, "run_only": run_only,
                             "reference_only": reference_only}
    for name, keys in (("all", shared), ("echo", [k for k in shared if run[k].echoed]),
                       ("no_echo", [k for k in shared if not run[k].echoed])):
        split[f"questions_{name}"] = len(keys)
        split[f"run_recall_{name}"] = _recall(run[k] for k in keys)
        split[f"reference_recall_{name}"] = _recall(reference[k] for k in keys)
    return split


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def queries_markdown(runs: list[tuple[str, dict[str, Any]]],
                     against: list[tuple[str, str, dict[str, Any]]] | None = None) -> str:
    """The per-run table and, when given, the run-against-reference table."""
    lines = ["| traces | questions | no credit | searches / question | directions / round | words / query | "
             "echo the question (%) | evidence recall | recall, echo | recall, no echo |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in runs:
        lines.append(f"| {name} | {s['questions']} | {s['no_credit']} | {_num(s['searches_per_question'], 2)} | "
                     f"{_num(s['directions_per_round'], 2)} | {_num(s['words_per_query'])} | {_pct(s['echo_share'])} | "
                     f"{_pct(s['recall'])} | {_pct(s['recall_echo'])} | {_pct(s['recall_no_echo'])} |")
    if against:
        lines += ["", "| traces | against | questions | gold | found by both | run only | reference only | "
                  "recall: run / reference | echo: run / reference (questions) | "
                  "no echo: run / reference (questions) |",
                  "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
        for name, ref, a in against:
            lines.append(
                f"| {name} | {ref} | {a['questions']} | {a['gold']} | {a['both']} | {a['run_only']} | "
                f"{a['reference_only']} | {_pct(a['run_recall_all'])} / {_pct(a['reference_recall_all'])} | "
                f"{_pct(a['run_recall_echo'])} / {_pct(a['reference_recall_echo'])} ({a['questions_echo']}) | "
                f"{_pct(a['run_recall_no_echo'])} / {_pct(a['reference_recall_no_echo'])} "
                f"({a['questions_no_echo']}) |")
    return "\n".join(lines)


__all__ = ["QuestionSearch", "against_summary", "question_search", "queries_markdown", "read_searches",
           "run_summary", "traces_files"]
