"""Turn a model name into something `from_pretrained`, vLLM and sentence-transformers can load.

- `builtin:NAME`: materialised once under `$MAPS_TRAIN_HOME/builtins/NAME` from installed packages (no network).
- a local folder: used as it is.
- a hub id (`Qwen/Qwen3-4B`): returned unchanged for online users; offline, it must already be in the HF cache,
  otherwise a one-line error names the builtins and local paths that would work.
"""

from __future__ import annotations

import os
from pathlib import Path

from maps_train.errors import MapsTrainError

BUILTINS = ("smollm2-135m-instruct", "minilm-l6", "tiny-qwen3")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def resolve_model(name: str) -> str:
    """A local path (or, online, a hub id) for `name`; materialises builtins on first use."""
    if name.startswith("builtin:"):
        from maps_train.models import builtins

        return str(builtins.materialise(name.removeprefix("builtin:")))
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise MapsTrainError(f"model '{name}': no such local path, and not a hub id (owner/name)")
    if _offline():
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(name, local_files_only=True)
        except Exception:
            raise MapsTrainError(
                f"model '{name}': not in the local Hugging Face cache and HF_HUB_OFFLINE is set; use a local path "
                f"or a builtin ({', '.join('builtin:' + b for b in BUILTINS)})"
            ) from None
    return name


def is_builtin(name: str) -> bool:
    return name.startswith("builtin:")
