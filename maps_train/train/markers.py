"""The one folder-marker policy of the stages that write model folders (`train`, `rl`).

A folder such a stage writes carries a marker file (`OUTPUT_MARKER`, a few bytes of JSON naming its writer) from
the moment it is created. A stage writes only into a folder that is absent, empty, or marked by that same stage:
training never resumes from (nor an RL run ships) another stage's checkpoints, and `train --overwrite` removes
only folders that carry a marker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from maps_train.adapters.set import RL_SUMMARY_FILE as RL_RECORD
from maps_train.errors import MapsTrainError

OUTPUT_MARKER = ".written-by-maps-train"
SFT_WRITER = "maps-train"  # `written_by` of training's markers
RL_WRITER = "maps-train rl"
RL_SUMMARY_FILE = RL_RECORD  # in an RL adapter's folder, written last; the adapter set reads its trained roles


def marker_writer(folder: Path) -> str | None:
    """The `written_by` of the folder's marker; None without one; "unknown" when it cannot be read."""
    marker = folder / OUTPUT_MARKER
    if folder.is_symlink() or not marker.is_file():
        return None
    try:
        with marker.open("rb") as handle:
            written = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return "unknown"
    return str(written.get("written_by")) if isinstance(written, dict) else "unknown"


def is_empty_folder(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())


def write_problem(folder: Path, writer: str) -> str | None:
    """Why `writer` must not write into `folder` (None when it may): a link, another stage's marker, or files
    nothing says maps-train wrote."""
    if folder.is_symlink():
        return "is a symbolic link"
    if not folder.exists() or is_empty_folder(folder):
        return None
    found = marker_writer(folder)
    if found is None:
        return f"has no {OUTPUT_MARKER} (not a folder maps-train wrote)"
    if found != writer:
        return f"holds another stage's output ({OUTPUT_MARKER} says {found!r})"
    return None


def mark(folder: Path, writer: str, **about: Any) -> None:
    """Create `folder` (when absent) with `writer`'s marker (when it has none)."""
    folder.mkdir(parents=True, exist_ok=True)
    if marker_writer(folder) is None:
        (folder / OUTPUT_MARKER).write_text(json.dumps({"written_by": writer, **about}) + "\n", encoding="utf-8")


def claim(folder: Path, writer: str, stage: str, hint: str, **about: Any) -> None:
    """`mark` after `write_problem`: one line naming the folder, the stage, what is wrong and `hint`."""
    problem = write_problem(folder, writer)
    if problem:
        raise MapsTrainError(f"{folder}: {stage} would write into it, but it {problem}; {hint}")
    mark(folder, writer, **about)
