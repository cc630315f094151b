"""What made each stage of a study, written beside what it made, so a rerun with other settings cannot reuse it.

Every stage folder of a study (the split, the traces, the SFT sets, the adapters, the RL adapters, the eval) gets
`study-stage.json` when the study starts that stage: the stage's name and its key, the settings and inputs the stage
reads (the split: `--dev`, `--train`, `--seed` and the source files' hashes; a later stage: the key digest of the
stage before it and the recipe sections it reads). A rerun compares each folder's key with its own before any
stage runs (`check_stages`):

- the same key: the stage is reused, or resumed where a killed study stopped;
- another key: a one-line refusal naming the first setting that differs, unless `--rebuild-from` names that stage
  or an earlier one, which removes the stamped folders from there on (only folders a study stamped: a study never
  removes what it did not write);
- a non-empty folder with no stamp (made by hand, or by a study before stamps): a one-line refusal.

Keys chain: a stage's key holds the digest of the key before it, so a new split makes every later stage differ.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.paths import write_text_atomic

STAMP_FILE = "study-stage.json"
STAGE_ORDER = ("split", "traces", "sft-data", "train", "rl", "eval")


def digest(value: Any) -> str:
    """A short hash of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: str | Path) -> str:
    """A short sha256 of a file's bytes, read in chunks."""
    sha = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()[:16]


@dataclass(frozen=True)
class Stage:
    name: str  # one of STAGE_ORDER
    folder: Path
    key: dict[str, Any]  # what makes it: its settings and inputs, the stage before it by digest

    @property
    def digest(self) -> str:
        return digest(self.key)

    @property
    def stamp(self) -> Path:
        return self.folder / STAMP_FILE


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(_leaves(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _shown(name: str, value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{name} {text}" if name.startswith("--") else f"{name} = {text}"


def key_difference(made: dict[str, Any], asked: dict[str, Any]) -> str:
    """'made with --dev 2, this run asks --dev 3' for the first differing setting (and how many more differ)."""
    old, new = _leaves(made), _leaves(asked)
    differing = [name for name in sorted(old.keys() | new.keys()) if old.get(name, "(unset)") != new.get(name, "(unset)")]
    if not differing:
        return "made with the same settings"
    # flags first: they are what a user changed on the command line
    differing.sort(key=lambda name: (not name.startswith("--"), name))
    first = differing[0]
    more = f" (and {len(differing) - 1} more setting{'s' if len(differing) > 2 else ''})" if len(differing) > 1 else ""
    return (f"made with {_shown(first, old.get(first, '(unset)'))}, this run asks "
            f"{_shown(first, new.get(first, '(unset)'))}{more}")


def read_stamp(stage: Stage) -> dict[str, Any] | None:
    """The stamp's record, None when there is none; a one-line error for an unreadable one."""
    if not stage.stamp.is_file():
        return None
    try:
        record = json.loads(stage.stamp.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MapsTrainError(f"{stage.stamp}: unreadable study record ({err}); remove the folder or use another "
                             f"--out") from None
    if not isinstance(record, dict) or not isinstance(record.get("key"), dict):
        raise MapsTrainError(f"{stage.stamp}: not a study record (no 'key'); remove the folder or use another --out")
    return record


def _has_content(folder: Path) -> bool:
    return folder.is_dir() and any(entry.name not in (".lock",) for entry in folder.iterdir())


def check_stages(stages: Sequence[Stage], rebuild_from: str | None) -> list[Stage]:
    """Refuse (one line) a stage folder made with other settings, or made by no study; returns the stamped
    folders `--rebuild-from` will remove (from the named stage on). Removes nothing itself."""
    names = [stage.name for stage in stages]
    if rebuild_from is not None and rebuild_from not in names:
        raise MapsTrainError(f"--rebuild-from {rebuild_from}: not a stage of this study ({', '.join(names)})")
    start = names.index(rebuild_from) if rebuild_from is not None else len(names)
    to_remove = []
    for index, stage in enumerate(stages):
        record = read_stamp(stage)
        if record is None:
            if _has_content(stage.folder):
                raise MapsTrainError(f"{stage.folder}: holds files no study stamped (no {STAMP_FILE}): made by hand "
                                     f"or by a study before stages were keyed; remove it, or use another --out or "
                                     f"recipe folder")
            continue
        if index >= start:
            to_remove.append(stage)
        elif record["key"] != stage.key:
            raise MapsTrainError(f"{stage.stamp}: {key_difference(record['key'], stage.key)}; use another --out or "
                                 f"--rebuild-from {stage.name}")
    return to_remove


def remove_stages(stages: Sequence[Stage]) -> None:
    """Remove the stamped folders (`check_stages` returned them): only what a study wrote."""
    for stage in stages:
        if read_stamp(stage) is not None:
            shutil.rmtree(stage.folder)


def write_stamp(stage: Stage, **extra: Any) -> None:
    """Stamp the stage's folder with its key (before the stage runs, so a killed stage resumes under it)."""
    write_text_atomic(stage.stamp, json.dumps({"stage": stage.name, "digest": stage.digest, "key": stage.key,
                                               **extra}, indent=1, sort_keys=True) + "\n")


__all__ = ["STAGE_ORDER", "STAMP_FILE", "Stage", "check_stages", "digest", "file_digest", "key_difference",
           "read_stamp", "remove_stages", "write_stamp"]
