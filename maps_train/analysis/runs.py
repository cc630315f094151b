"""Finding an agent's runs and their questions: run folders, eval suite output folders, and gold evidence.

Accepted inputs (`find_runs`):
- an eval suite's output folder (`maps-train eval`): `<out>/runs/<system>/<dataset>/{answers,traces}.jsonl`;
- one system's folder in it (`<out>/runs/<system>`), or one run folder (`<out>/runs/<system>/<dataset>`);
- any folder holding `answers.jsonl` / `traces.jsonl` (`maps-train run --out DIR`), named after the folder.
The system name (the folder under `runs/`), not the record's `method`, labels a run: the MAPS ablations all run as
method `maps`.

Traces carry no question metadata, so gold evidence is looked up by (data set, question id): in question files
given explicitly (`QuestionIndex(extra_files=...)`), else in the data sets named by the suite's `suite.yaml`
(`path:`, or the JSONL files under `<data_root>/<name>/`), relative paths tried from the working directory, the
suite folder and its parents. A data set that cannot be found (a hub set, a moved folder) simply has no gold.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.analysis.gold import gold_corpus_ids, gold_passages
from maps_train.analysis.sequences import SubquerySequence, sequence_from_trace
from maps_train.analysis.trace_reader import read_traces
from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl

ANSWERS = "answers.jsonl"  # the runner's file names (maps_train.agents.runner)
TRACES = "traces.jsonl"
SUITE_MANIFEST = "suite.yaml"  # written by `maps-train eval` into its output folder


@dataclass(frozen=True)
class RunFolder:
    system: str
    dataset: str | None  # None outside a suite
    path: Path
    suite_root: Path | None = None

    @property
    def traces(self) -> Path:
        return self.path / TRACES

    @property
    def answers(self) -> Path:
        return self.path / ANSWERS


def _is_run(path: Path) -> bool:
    return (path / TRACES).is_file() or (path / ANSWERS).is_file()


def _suite_root(path: Path) -> Path | None:
    return path if (path / SUITE_MANIFEST).is_file() else None


def _system_runs(system_dir: Path, suite_root: Path | None) -> list[RunFolder]:
    if _is_run(system_dir):
        return [RunFolder(system_dir.name, None, system_dir, suite_root)]
    return [
        RunFolder(system_dir.name, d.name, d, suite_root) for d in sorted(system_dir.iterdir()) if d.is_dir() and _is_run(d)
    ]


def _every_system(runs_dir: Path, suite_root: Path | None) -> list[RunFolder]:
    return [r for d in sorted(runs_dir.iterdir()) if d.is_dir() for r in _system_runs(d, suite_root)]


def find_runs(path: str | Path) -> list[RunFolder]:
    """The run folders under `path` (see the module docstring); an error when there is none."""
    path = Path(path)
    if not path.is_dir():
        raise MapsTrainError(f"{path}: not a folder (want a run folder or an eval suite output folder)")
    if (path / "runs").is_dir():  # a suite's output folder
        runs = _every_system(path / "runs", _suite_root(path))
    elif path.name == "runs" and not _is_run(path):  # its runs/ folder (or any folder of system folders so named)
        runs = _every_system(path, _suite_root(path.parent))
    elif _is_run(path):
        in_suite = path.parent.parent.name == "runs"
        runs = [
            RunFolder(path.parent.name, path.name, path, _suite_root(path.parent.parent.parent))
            if in_suite
            else RunFolder(path.name, None, path, None)
        ]
    else:  # one system's folder of data-set runs
        runs = _system_runs(path, _suite_root(path.parent.parent) if path.parent.name == "runs" else None)
    if not runs:
        raise MapsTrainError(f"{path}: no answers.jsonl or traces.jsonl in it or under runs/<system>/<dataset>/")
    return runs


# -- question metadata ---------------------------------------------------------------------------------------------


def _bases(suite_root: Path | None) -> list[Path]:
    bases = [Path.cwd()]
    if suite_root is not None:
        bases += [suite_root.resolve(), *suite_root.resolve().parents]
    return bases


def _existing(relative: str | Path, bases: list[Path]) -> Path | None:
    candidate = Path(relative)
    if candidate.is_absolute():
        return candidate if candidate.exists() else None
    return next((base / candidate for base in bases if (base / candidate).exists()), None)


def suite_dataset_files(suite_root: Path, data_root: str | Path | None = None) -> dict[str, list[Path]]:
    """Per data set of the suite, the question files that may hold its questions (best guess first)."""
    import yaml

    manifest = suite_root / SUITE_MANIFEST
    try:
        suite = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise MapsTrainError(f"{manifest}: cannot read the suite manifest ({err})") from None
    bases = _bases(suite_root)
    root = _existing(data_root or suite.get("data_root") or "data", bases) if data_root or suite else None
    files: dict[str, list[Path]] = {}
    for spec in suite.get("datasets") or []:
        if not isinstance(spec, dict) or not spec.get("name"):
            continue
        name = str(spec["name"])
        found: list[Path] = []
        if spec.get("path"):
            path = _existing(spec["path"], bases)
            found += [path] if path is not None else []
        elif root is not None and (root / name).is_dir():
            # The registry's split is evaluate's business (same layer); the split named here, then dev and test,
            # then any other JSONL of the folder: ids are looked up, so a wrong guess costs a scan, not a mistake.
            order = [spec.get("split"), "dev", "test"]
            found += sorted((root / name).glob("*.jsonl"), key=lambda p: (_rank(p.stem, order), p.name))
        files[name] = found
    return files


def _rank(stem: str, order: list[Any]) -> int:
    return order.index(stem) if stem in order else len(order)


class QuestionIndex:
    """Question metadata by (data set, id), read lazily from question files; gold passages from it."""

    def __init__(
        self,
        extra_files: Iterable[str | Path] = (),
        data_root: str | Path | None = None,
        corpus: str | Path | None = None,
    ) -> None:
        self.extra_files = [Path(p) for p in extra_files]
        self.data_root = data_root
        self.corpus = Path(corpus) if corpus else None
        self._metadata: dict[tuple[str, str], dict[str, Any]] = {}
        self._any_dataset: dict[str, dict[str, Any]] = {}  # from extra files, whatever their data set
        self._scanned: set[Path] = set()
        self._passages: dict[str, str] = {}
        self.missing: dict[str, int] = {}  # data set -> questions without metadata (reported once)

    def _scan(self, path: Path, dataset: str | None) -> None:
        """Keep the metadata of every row of `path` (one file serves every system that ran its data set)."""
        if path in self._scanned:
            return
        self._scanned.add(path)
        for _, row in iter_jsonl(path, "questions file"):
            qid = str(row.get("id", ""))
            metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
            if dataset is None:
                self._any_dataset[qid] = metadata
            else:
                self._metadata[(dataset, qid)] = metadata

    def metadata(self, run: RunFolder, question_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Metadata of `question_ids` of `run`'s data set ({} for a question not found)."""
        wanted = {str(q) for q in question_ids}
        for path in self.extra_files:
            self._scan(path, None)
        dataset = run.dataset or ""

        def all_found() -> bool:
            return all((dataset, q) in self._metadata or q in self._any_dataset for q in wanted)

        if run.suite_root is not None and run.dataset and not all_found():
            for path in suite_dataset_files(run.suite_root, self.data_root).get(run.dataset, []):
                self._scan(path, run.dataset)
                if all_found():
                    break
        found = {}
        for qid in wanted:
            metadata = self._metadata.get((dataset, qid), self._any_dataset.get(qid))
            if metadata is not None:
                found[qid] = metadata
        missing = len(wanted) - len(found)
        if missing and dataset not in self.missing:
            print(f"maps-train analyze: {run.system}/{dataset or run.path.name}: {missing} questions without metadata "
                  "(no gold evidence for them); give --questions FILE or --data-root DIR", file=sys.stderr)
        self.missing[dataset] = self.missing.get(dataset, 0) + missing
        return found

    def gold(self, metadata: dict[str, Any]) -> list[str]:
        ids = gold_corpus_ids(metadata)
        if ids and self.corpus is not None and not self._passages:
            self._load_corpus()
        return gold_passages(metadata, self._passages)

    def _load_corpus(self) -> None:
        # Only metadata that names passages by id without their text needs this (the demo world's); such corpora
        # are small. FlashRAG `contents` is "title\ntext" already.
        for _, row in iter_jsonl(self.corpus, "corpus"):
            text = row.get("contents") or f"{row.get('title', '')}\n{row.get('text', '')}"
            self._passages[str(row.get("id"))] = str(text).strip()


# -- what the analyses read ----------------------------------------------------------------------------------------


def run_sequences(
    runs: list[RunFolder], index: QuestionIndex | None = None, include_question_searches: bool = False
) -> dict[str, list[SubquerySequence]]:
    """Per system, the searched sub-query sequences of every traced question, with gold evidence when known."""
    index = index or QuestionIndex()
    by_system: dict[str, list[SubquerySequence]] = {}
    for run in runs:
        if not run.traces.is_file():
            continue
        traces = read_traces(run.traces)
        metadata = index.metadata(run, [t.question_id for t in traces])
        for trace in traces:
            evidence = index.gold(metadata.get(trace.question_id) or {})
            sequence = sequence_from_trace(trace, evidence, include_question_searches)
            sequence.dataset = run.dataset or trace.dataset
            by_system.setdefault(run.system, []).append(sequence)
    return by_system
