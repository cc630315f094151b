"""Per-adapter SFT sets: `<sft_dir>/<adapter>/train.jsonl` (and optional `eval.jsonl`) as `datasets.Dataset`s.

Each row is TRL's conversational prompt-completion format:
`{"prompt": [system, user messages], "completion": [assistant message], "chat_template_kwargs": {...}}`.
Metadata columns (`question_id`, `role`, ...) are dropped here, so the trainer only sees what it tokenizes.
Bad rows fail with one line naming the file, the line and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.jsonl import iter_jsonl
from maps_train.recipe import SHARED_ADAPTER, train_sft_dir

KEPT_COLUMNS = ("prompt", "completion", "chat_template_kwargs")
PROMPT_ROLES = ("system", "user", "assistant")


def source_adapters(recipe, adapter: str) -> list[str]:
    """The SFT folders whose rows train `adapter` (all of them for the shared adapter)."""
    names = list(recipe.sft_data.adapter_roles)
    if adapter == SHARED_ADAPTER and recipe.train.shared_adapter:
        return names
    if adapter not in names:
        raise MapsTrainError(
            f"--role {adapter}: not an adapter of this recipe (sft_data.adapter_roles has {', '.join(names)}; "
            f"'{SHARED_ADAPTER}' needs train.shared_adapter=true)"
        )
    return [adapter]


def _check_messages(value: Any, field: str, where: str, completion: bool) -> None:
    if not isinstance(value, list) or not value:
        raise MapsTrainError(f"{where}: '{field}' must be a non-empty list of {{role, content}} messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise MapsTrainError(f"{where}: {field}[{i}] must be a message with a string 'content'")
        role = message.get("role")
        if completion and role != "assistant":
            raise MapsTrainError(f"{where}: {field}[{i}].role must be 'assistant', got {role!r}")
        if not completion and role not in PROMPT_ROLES:
            raise MapsTrainError(f"{where}: {field}[{i}].role must be one of {', '.join(PROMPT_ROLES)}, got {role!r}")


def read_sft_rows(path: Path, default_template_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Validated rows of one JSONL file, reduced to the columns the trainer uses."""
    rows = []
    for line_no, raw in iter_jsonl(path, "SFT file"):
        where = f"{path}:{line_no}"
        for field in ("prompt", "completion"):
            if field not in raw:
                raise MapsTrainError(f"{where}: missing field '{field}' (rows are prompt-completion messages)")
        _check_messages(raw["prompt"], "prompt", where, completion=False)
        _check_messages(raw["completion"], "completion", where, completion=True)
        kwargs = raw.get("chat_template_kwargs", default_template_kwargs)
        if not isinstance(kwargs, dict):
            raise MapsTrainError(f"{where}: 'chat_template_kwargs' must be an object")
        rows.append(
            {
                "prompt": [{"role": m["role"], "content": m["content"]} for m in raw["prompt"]],
                "completion": [{"role": m["role"], "content": m["content"]} for m in raw["completion"]],
                "chat_template_kwargs": kwargs,
            }
        )
    return rows


def _split_path(sft_dir: Path, adapter: str, split: str) -> Path:
    return sft_dir / adapter / f"{split}.jsonl"


def _source_files(recipe, adapter: str, split: str) -> list[Path]:
    """The `split` files of the SFT folders that train `adapter`; a missing train file is an error, a missing eval
    file is left out."""
    sft_dir = train_sft_dir(recipe)
    files = []
    for source in source_adapters(recipe, adapter):
        path = _split_path(sft_dir, source, split)
        if path.is_file():
            files.append(path)
        elif split == "train":
            raise MapsTrainError(f"{path}: no such SFT file (run `maps-train sft-data` with this recipe first)")
    return files


def load_adapter_rows(recipe, adapter: str, split: str = "train") -> list[dict[str, Any]]:
    """All rows training `adapter` for `split`; a missing train file is an error, a missing eval file is not."""
    default_kwargs = {"enable_thinking": recipe.sft_data.enable_thinking}
    rows: list[dict[str, Any]] = []
    for path in _source_files(recipe, adapter, split):
        rows.extend(read_sft_rows(path, default_kwargs))
    if split == "train" and not rows:
        raise MapsTrainError(f"{_split_path(train_sft_dir(recipe), adapter, split)}: no training rows")
    # Arrow wants one struct type per column: rows missing a key take the recipe default (never None, which a
    # template would read as "set"); with no keys at all the column goes (TRL would unpack a null).
    keys = sorted({key for row in rows for key in row["chat_template_kwargs"]})
    for row in rows:
        kwargs = row.pop("chat_template_kwargs")
        if keys:
            row["chat_template_kwargs"] = {key: kwargs.get(key, default_kwargs.get(key)) for key in keys}
    return rows


def train_row_count(recipe, adapter: str) -> int:
    """The rows that would train `adapter` (0 when every role it serves kept none); a missing train file is an
    error, as for `load_adapter_rows`."""
    return sum(1 for path in _source_files(recipe, adapter, "train") for _ in iter_jsonl(path, "SFT file"))


def rows_per_role(recipe, adapter: str) -> dict[str, int] | None:
    """Train rows per trace role of `adapter`, every role its SFT folders serve included (0 when it has none, as
    under `sft_data.min_rows_per_role`): what the adapter learned, recorded in its training summary, so the
    distilled routes can send a role it never learned to the base model (`maps_train.serve.plan`). None when a
    row names no role of the adapter (a set written by hand or before rows carried their role): unknown."""
    counts = {role: 0 for name in source_adapters(recipe, adapter) for role in recipe.sft_data.adapter_roles[name]}
    sft_dir = train_sft_dir(recipe)
    for name in source_adapters(recipe, adapter):
        for _, raw in iter_jsonl(_split_path(sft_dir, name, "train"), "SFT file"):
            role = raw.get("role")
            if role not in counts:
                return None
            counts[role] += 1
    return counts


def load_adapter_datasets(recipe, adapter: str):
    """(train, eval or None) `datasets.Dataset`s for one adapter."""
    from datasets import Dataset

    train_rows = load_adapter_rows(recipe, adapter, "train")
    eval_rows = load_adapter_rows(recipe, adapter, "eval")
    train = Dataset.from_list(train_rows)
    evaluation = Dataset.from_list(eval_rows) if eval_rows else None
    return train, evaluation
