"""Reading JSON-lines files whose errors name the file and line (`path:line: ...`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError


def iter_jsonl(path: str | Path, what: str = "file") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-empty line; a missing file, bad JSON or a non-object is one error line."""
    path = Path(path)
    if not path.is_file():
        raise MapsTrainError(f"{path}: no such {what}")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise MapsTrainError(f"{path}:{number}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise MapsTrainError(f"{path}:{number}: expected a JSON object per line")
            yield number, row
