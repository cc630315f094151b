"""A route's LoRA adapter folder: checked to be one, and the name a backend loads it under."""

from __future__ import annotations

import re
from pathlib import Path

from maps_train.errors import MapsTrainError


def adapter_dir(path: str, role: str) -> Path:
    """A LoRA adapter folder, checked; the error names the route field."""
    folder = Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise MapsTrainError(
            f"roles.{role}.adapter: '{path}' is not a LoRA adapter folder (no adapter_config.json there)"
        )
    return folder


def adapter_name(path: str) -> str:
    """A stable, module-safe name for an adapter folder (PEFT adapter names become module keys: no dots)."""
    base = Path(path.rstrip("/")).name or "adapter"
    return re.sub(r"\W", "_", base)
