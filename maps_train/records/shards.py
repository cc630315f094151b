"""One run split over machines: which questions a shard runs, where it writes, and merging the shards back.

`--shard I/N` (`maps-train traces`, `run` and `eval`) runs only the questions whose id hashes to shard I of N
(sha256 of the id, mod N: stable whatever the file order, the limit or the sample around it) and writes under
`<out>/shards/I-of-N/` exactly what the whole run writes under `<out>`. Each shard resumes on its own. Once the
shard folders sit under one `<out>/shards/` (a shared disk, or copied there), `merge_shards(<out>)` (`maps-train
merge-shards OUT`) appends every finished question to `<out>`'s own files through `KeyedJsonl`: a question
already there is skipped (so merging twice, or merging shards of a partly finished whole run, never duplicates),
a trace goes in only with its answer line, and shards of another configuration are refused.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from maps_train.errors import MapsTrainError
from maps_train.records.store import KeyedJsonl
from maps_train.records.trace import restore_lost_answers

ANSWERS_FILE = "answers.jsonl"
TRACES_FILE = "traces.jsonl"
RESULTS_FILE = "results.jsonl"  # an eval suite's scored rows
RESULT_KEY = ("system", "dataset", "question_id")
SHARDS_DIR = "shards"
COPIED = ("samples.json", "suite.yaml")  # the same in every shard of a suite: copied once when absent

T = TypeVar("T")
_FOLDER = re.compile(r"^(\d+)-of-(\d+)$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str | None) -> Shard | None:
        """`"2/4"` -> Shard(2, 4); None or empty -> None; anything else is a one-line error."""
        if not text:
            return None
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            raise MapsTrainError(f"--shard: expected I/N with 1 <= I <= N (e.g. 2/4), got '{text}'")
        return cls(int(match.group(1)), int(match.group(2)))

    def holds(self, question_id: str) -> bool:
        digest = hashlib.sha256(question_id.encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index - 1

    def select(self, items: Iterable[T], key: Callable[[T], str] = lambda q: q.id) -> list[T]:  # type: ignore[attr-defined]
        return [item for item in items if self.holds(key(item))]

    @property
    def folder(self) -> str:
        return f"{self.index}-of-{self.count}"

    def out_dir(self, out: str | Path) -> Path:
        return Path(out) / SHARDS_DIR / self.folder


def in_shard_folder(path: Path, root: Path) -> bool:
    """Whether `path` lies in a shard's folder under `root` (whole-run readers skip those: they are merged)."""
    parts = path.relative_to(root).parts
    return any(a == SHARDS_DIR and _FOLDER.match(b) for a, b in zip(parts, parts[1:]))


@dataclass
class MergeReport:
    shards: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # shard folders of 1..N not found
    added: dict[str, int] = field(default_factory=dict)  # destination file -> rows appended
    skipped: int = 0  # rows whose key the destination already held

    def lines(self) -> list[str]:
        lines = [f"shards merged: {', '.join(self.shards)}" + (f" (missing: {', '.join(self.missing)})"
                                                               if self.missing else "")]
        lines += [f"  +{count} {path}" for path, count in sorted(self.added.items())]
        lines.append(f"  {self.skipped} rows already there (skipped)")
        return lines


def merge_shards(out: str | Path) -> MergeReport:
    out = Path(out)
    root = out / SHARDS_DIR
    folders = sorted((p for p in root.glob("*") if p.is_dir() and _FOLDER.match(p.name)),
                     key=lambda p: int(_FOLDER.match(p.name).group(1)))  # type: ignore[union-attr]
    if not folders:
        raise MapsTrainError(f"{root}: no shard folders (I-of-N) to merge")
    counts = {int(_FOLDER.match(p.name).group(2)) for p in folders}  # type: ignore[union-attr]
    if len(counts) != 1:
        raise MapsTrainError(f"{root}: shards of different splits ({', '.join(p.name for p in folders)})")
    (count,) = counts
    report = MergeReport(shards=[p.name for p in folders])
    present = {int(_FOLDER.match(p.name).group(1)) for p in folders}  # type: ignore[union-attr]
    report.missing = [f"{i}-of-{count}" for i in range(1, count + 1) if i not in present]
    for folder in folders:
        for answers in sorted(folder.rglob(ANSWERS_FILE)):
            _merge_run(answers.parent, out / answers.parent.relative_to(folder), report)
        for results in sorted(folder.rglob(RESULTS_FILE)):
            _merge_rows(results, out / results.relative_to(folder), RESULT_KEY, report)
        for name in COPIED:
            source, target = folder / name, out / name
            if source.is_file() and not target.exists():
                shutil.copyfile(source, target)
    return report


def _merge_run(source: Path, target: Path, report: MergeReport) -> None:
    """One run folder's answers (and their traces) into the same folder of the whole run."""
    answers, traces = KeyedJsonl(target / ANSWERS_FILE), KeyedJsonl(target / TRACES_FILE)
    done = answers.load()
    restore_lost_answers(answers, traces, done)  # a trace left without its answer line by a kill: as on resume
    incoming = KeyedJsonl(source / ANSWERS_FILE).load()
    incoming_traces = KeyedJsonl(source / TRACES_FILE).load()
    _check_same_config(source, target, done, incoming)
    added = 0
    with answers, traces:
        for key, row in incoming.items():
            if key in done:
                report.skipped += 1
                continue
            if key in incoming_traces:
                traces.append(incoming_traces[key])
            answers.append(row)
            added += 1
    if added:
        key = str(target / ANSWERS_FILE)
        report.added[key] = report.added.get(key, 0) + added


def _merge_rows(source: Path, target: Path, key: Any, report: MergeReport) -> None:
    rows = KeyedJsonl(target, key=key)
    have = rows.load()
    added = 0
    with rows:
        for row_key, row in KeyedJsonl(source, key=key).load().items():
            if row_key in have:
                report.skipped += 1
                continue
            rows.append(row)
            added += 1
    if added:
        report.added[str(target)] = report.added.get(str(target), 0) + added


def _check_same_config(source: Path, target: Path, done: dict, incoming: dict) -> None:
    configs = {(row.get("method"), row.get("config_digest")) for row in [*done.values(), *incoming.values()]}
    if len(configs) > 1:
        raise MapsTrainError(
            f"{source}: answers of another configuration than {target} ({sorted(map(str, configs))}); "
            "shards merge only with runs of the same recipe"
        )
