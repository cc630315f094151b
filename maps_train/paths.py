"""Where maps-train keeps what it materialises (builtin models): $MAPS_TRAIN_HOME, else the user cache dir."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    root = os.environ.get("MAPS_TRAIN_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "maps-train"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
