"""Small retrieval worlds built from ../shared/realdata for the end-to-end tests and the agent bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_paragraph_world(dataset_file: str | Path, n: int, out_dir: str | Path) -> tuple[Path, Path, set[str]]:
    """A self-contained small world from the first `n` questions of a FlashRAG file whose rows carry their
    paragraphs inline (`metadata.paragraphs[*]` with corpus_id/title/text, as in ../shared/realdata): writes
    `corpus.jsonl` (each paragraph once, "title\ntext" contents) and `questions.jsonl` under `out_dir`;
    returns both paths and the passage ids. Used by the end-to-end tests and the agent bench."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with Path(dataset_file).open(encoding="utf-8") as handle:
        for line in handle:
            if len(rows) == n:
                break
            if line.strip():
                rows.append(json.loads(line))
    passages: dict[str, dict[str, Any]] = {}
    for row in rows:
        for paragraph in row.get("metadata", {}).get("paragraphs", []):
            passages.setdefault(str(paragraph["corpus_id"]), paragraph)
    corpus, questions = out_dir / "corpus.jsonl", out_dir / "questions.jsonl"
    with corpus.open("w", encoding="utf-8") as sink:
        for pid, p in passages.items():
            sink.write(json.dumps({"id": pid, "title": p["title"], "contents": f"{p['title']}\n{p['text']}"}) + "\n")
    with questions.open("w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps({k: row[k] for k in ("id", "question", "golden_answers")}) + "\n")
    return corpus, questions, set(passages)
