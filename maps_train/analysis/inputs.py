"""What `maps-train analyze` reads, per method: sub-query sequences and stop rounds, from any accepted input.

An input is `[METHOD=]PATH` where PATH is
- a folder: an eval suite's output folder, one system's folder in it, or a run folder (see `runs.find_runs`);
  methods are named after the systems (a METHOD= label renames a folder that holds exactly one system);
- a `traces.jsonl` or `answers.jsonl` inside a run folder: read as that run folder (so gold evidence is found);
- any other JSONL: sub-query rows or MuSiQue rows (`sequences.load_sequences`), or answer records for stops;
  named by METHOD=, else (stops) the records' `method`, else the file's stem.
"""

from __future__ import annotations

from pathlib import Path

from maps_train.analysis.runs import ANSWERS, TRACES, QuestionIndex, find_runs, run_sequences
from maps_train.analysis.sequences import References, Relations, SubquerySequence, load_sequences
from maps_train.analysis.stops import StopRound, read_stop_rounds
from maps_train.errors import MapsTrainError

Source = tuple[str | None, Path]


def parse_sources(items: list[str]) -> list[Source]:
    """`METHOD=PATH` or bare `PATH` items (a path may itself hold '=' only after a METHOD= label)."""
    sources = []
    for item in items:
        method, sep, path = item.partition("=")
        if not sep or Path(item).exists():
            sources.append((None, Path(item)))
            continue
        if not method or not path:
            raise MapsTrainError(f"input '{item}': want METHOD=PATH or PATH")
        sources.append((method, Path(path)))
    if not sources:
        raise MapsTrainError("no input: give a run folder, a suite output folder, or METHOD=PATH of a JSONL file")
    return sources


def _run_folder(path: Path) -> Path | None:
    """The run folder `path` stands for, or None for a plain JSONL file."""
    if path.is_dir():
        return path
    if path.name in (TRACES, ANSWERS) and path.is_file():
        return path.parent
    return None


def _relabel(label: str | None, found: dict, where: Path) -> dict:
    if label is None:
        return found
    if len(found) != 1:
        raise MapsTrainError(f"{label}={where}: holds {len(found)} systems; drop the label to name them by folder")
    return {label: next(iter(found.values()))}


def _merge(into: dict[str, list], found: dict[str, list]) -> None:
    for method, items in found.items():
        into.setdefault(method, []).extend(items)


def sequences_by_method(
    sources: list[Source],
    index: QuestionIndex | None = None,
    references: References = "keep",
    relations: Relations = "keep",
    include_question_searches: bool = False,
) -> dict[str, list[SubquerySequence]]:
    index = index or QuestionIndex()
    by_method: dict[str, list[SubquerySequence]] = {}
    for label, path in sources:
        folder = _run_folder(path)
        if folder is not None:
            found = run_sequences(find_runs(folder), index, include_question_searches)
            if not found:
                raise MapsTrainError(f"{path}: no traces.jsonl (the sub-queries are read from traces)")
        else:
            found = {path.stem: load_sequences(path, references, relations)}
        _merge(by_method, _relabel(label, found, path))
    return by_method


def stop_rounds_by_method(sources: list[Source]) -> dict[str, list[StopRound]]:
    by_method: dict[str, list[StopRound]] = {}
    for label, path in sources:
        folder = _run_folder(path)
        found: dict[str, list[StopRound]] = {}
        if folder is not None:
            for run in find_runs(folder):
                if run.answers.is_file():
                    found.setdefault(run.system, []).extend(read_stop_rounds(run.answers))
            found = {k: v for k, v in found.items() if v}
            if not found:
                raise MapsTrainError(f"{path}: no answers.jsonl with records")
        else:
            for record in read_stop_rounds(path):
                found.setdefault(label or record.method or path.stem, []).append(record)
            label = None  # already applied per record
        _merge(by_method, _relabel(label, found, path))
    return by_method
