"""Turn a model name into something `from_pretrained`, vLLM and sentence-transformers can load.

- `builtin:NAME`: materialised once under `$MAPS_TRAIN_HOME/builtins/NAME` from installed packages (no network).
- a local folder: used as it is.
- a hub id (`Qwen/Qwen3-4B`): returned unchanged for online users; offline, it must already be in the HF cache,
  otherwise a one-line error names the builtins and local paths that would work.

Weights are loaded from safetensors only. `.bin`/`.pt` files are pickles that `torch.load` may execute code from,
so a folder whose weights exist only in that form is refused here, by name, before any loader sees it
(`require_safetensors`; adapters: `require_safetensors_adapter`). Hub ids that are not downloaded yet cannot be
checked here: their loaders pass `use_safetensors=True`.
"""

from __future__ import annotations

import os
from pathlib import Path

from maps_train.errors import MapsTrainError

BUILTINS = ("smollm2-135m-instruct", "minilm-l6", "tiny-qwen3")
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
ADAPTER_SAFETENSORS = "adapter_model.safetensors"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def resolve_model(name: str) -> str:
    """A local path (or, online, a hub id) for `name`; materialises builtins on first use."""
    if name.startswith("builtin:"):
        from maps_train.models import builtins

        return str(builtins.materialise(name.removeprefix("builtin:")))
    path = Path(name).expanduser()
    if path.exists():
        require_safetensors(path, f"model '{name}'")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise MapsTrainError(f"model '{name}': no such local path, and not a hub id (owner/name)")
    if _offline():
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(name, local_files_only=True)
        except Exception:
            raise MapsTrainError(
                f"model '{name}': not in the local Hugging Face cache and HF_HUB_OFFLINE is set; use a local path "
                f"or a builtin ({', '.join('builtin:' + b for b in BUILTINS)})"
            ) from None
        require_safetensors(Path(folder), f"model '{name}'")
        return folder
    return name


def _pickled_only(folder: Path) -> list[str]:
    """Pickled weight files in `folder` when it holds no safetensors file (those would be what gets loaded)."""
    files = [p.name for p in folder.iterdir() if p.is_file()]
    if any(n.endswith((".safetensors", ".safetensors.index.json")) for n in files):
        return []
    return sorted(n for n in files if n.lower().endswith(PICKLED_WEIGHTS) or n.endswith(".bin.index.json"))


def require_safetensors(path: Path, what: str) -> None:
    """Refuse a model folder whose weights are pickles only (checked: the folder and its direct subfolders, where
    sentence-transformers keeps module weights). A file (GGUF) or a folder without weights passes."""
    if not path.is_dir():
        return
    for folder in (path, *sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))):
        pickled = _pickled_only(folder)
        if pickled:
            raise MapsTrainError(
                f"{what}: {folder} has weights only as pickles ({', '.join(pickled[:3])}), which are not loaded "
                f"(torch.load can run code); convert them to safetensors (save_pretrained(..., safe_serialization=True))"
            )


def require_safetensors_adapter(folder: Path, what: str) -> None:
    """Refuse a LoRA folder without `adapter_model.safetensors` (PEFT would fall back to a pickled .bin)."""
    if (folder / ADAPTER_SAFETENSORS).is_file():
        return
    pickled = _pickled_only(folder)
    found = f"only {', '.join(pickled[:3])}, which is not loaded (torch.load can run code)" if pickled else "none"
    raise MapsTrainError(f"{what}: {folder} has no {ADAPTER_SAFETENSORS} ({found}); save the adapter as safetensors")
