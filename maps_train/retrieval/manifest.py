"""`manifest.json`: what an index directory was built from, written last, so its presence means "finished".

Loading checks it against the corpus and encoder asked for, and refuses a mismatch with one line, because a
FAISS row number means nothing against another corpus and a vector means nothing against another encoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.paths import write_text_atomic

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def has_manifest(index_dir: str | Path) -> bool:
    return (Path(index_dir) / MANIFEST).is_file()


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        raise MapsTrainError(f"{index_dir}: no {MANIFEST}, not a finished index (run `maps-train index build`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise MapsTrainError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("kind") not in ("dense", "bm25"):
        raise MapsTrainError(f"{path}: unsupported manifest (format_version {manifest.get('format_version')})")
    return manifest


def check_manifest(
    manifest: dict[str, Any],
    index_dir: str | Path,
    corpus: str | Path | None = None,
    encoder: str | None = None,
    kind: str | None = None,
) -> None:
    """Raise one line naming the first field where the index differs from what was asked for."""
    from maps_train.retrieval.corpus import fingerprint

    if kind is not None and manifest["kind"] != kind:
        raise MapsTrainError(f"{index_dir}: index kind is '{manifest['kind']}', not '{kind}'")
    if corpus is not None:
        corpus_path = Path(corpus).expanduser()
        if not corpus_path.is_file():
            raise MapsTrainError(f"{corpus}: no such corpus file")
        built = manifest["corpus"]
        if fingerprint(corpus_path) != built["checksum"]:
            raise MapsTrainError(
                f"{index_dir}: index was built from corpus {built['path']} (checksum {built['checksum']}), "
                f"which differs from {corpus_path}; rebuild it with `maps-train index build`"
            )
    if encoder is not None and manifest["kind"] == "dense" and manifest["encoder"]["name"] != encoder:
        raise MapsTrainError(
            f"{index_dir}: index was built with encoder '{manifest['encoder']['name']}', not '{encoder}'; "
            f"rebuild it or point retrieval.index_dir elsewhere"
        )
