"""SFT rows that keep their completion: `sft-data` drops (and counts) every row TRL would cut at
`train.sft.max_length`, counted with the student's real tokenizer and chat template as TRL renders the row."""

from __future__ import annotations

import json

from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after
from transformers import AutoTokenizer

from maps_train.recipe import load_recipe, sft_set_dir
from maps_train.traces.collect import collect_traces
from maps_train.traces.sft import build_sft_sets

LONG_STATE = " ".join(f"step{i}" for i in range(300))  # a consolidator completion far longer than the others


def _consolidator(request, turn):
    """Consolidator outputs whose length differs by question: q1's are long, so its rows are the long ones."""
    short = json.loads(consolidator_sufficient_after(2)(request, turn))
    if request.question_id == "q1":
        short["state"] = LONG_STATE
    return json.dumps(short)


def _recipe(tmp_path, tiny_qwen3, max_length):
    questions = tmp_path / "train.jsonl"
    rows = [{"id": f"q{i}", "question": f"Who is q{i}?", "golden_answers": [f"answer of q{i}"]} for i in range(3)]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_recipe(None, [
        f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / 'traces'}",
        f"sft_data.out_dir={tmp_path / f'sft-{max_length}'}", f"train.student={tiny_qwen3}",
        f"train.sft.max_length={max_length}", "agent.num_directions=1",
    ])


def _rows(folder):
    return [json.loads(line) for path in sorted(folder.glob("*/train.jsonl")) for line in path.open()]


def _trl_length(tokenizer, row) -> int:
    """The row's tokens as TRL's SFTTrainer tokenizes a conversational prompt-completion row."""
    return len(tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True,
                                             **row["chat_template_kwargs"])["input_ids"])


def test_rows_over_max_length_are_dropped_and_counted_and_no_completion_is_cut(tmp_path, tiny_qwen3):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    uncapped = _recipe(tmp_path, tiny_qwen3, "null")
    collect_traces(uncapped, backend=ScriptedBackend({"consolidator": _consolidator}),
                   retriever=RecordingRetriever(), progress=False)
    build_sft_sets(uncapped)
    every_row = _rows(tmp_path / "sft-null")
    lengths = sorted(_trl_length(tokenizer, row) for row in every_row)
    max_length = lengths[-1] - 1  # at least the longest row (q1's consolidator rows) is over it
    over = sum(1 for n in lengths if n > max_length)
    assert 0 < over < len(lengths)

    capped = _recipe(tmp_path, tiny_qwen3, max_length)
    stats = build_sft_sets(capped)
    kept = _rows(tmp_path / f"sft-{max_length}")
    assert len(kept) == len(every_row) - over
    assert all(_trl_length(tokenizer, row) <= max_length for row in kept)  # TRL keeps each whole
    originals = {(r["question_id"], r["role"], json.dumps(r["prompt"])): r["completion"] for r in every_row}
    assert all(originals[(r["question_id"], r["role"], json.dumps(r["prompt"]))] == r["completion"] for r in kept)

    saved = json.loads((tmp_path / f"sft-{max_length}" / "stats.json").read_text())
    assert saved["rejects"]["over_max_length"] == over
    assert saved["rows"]["consolidator"]["over_max_length"] >= 1
    assert "over_max_length" in stats.table() and f"over_max_length={over}" in stats.table()


def test_max_length_decides_the_sft_set_folder(tmp_path, tiny_qwen3):
    assert sft_set_dir(_recipe(tmp_path, tiny_qwen3, 1024)) != sft_set_dir(_recipe(tmp_path, tiny_qwen3, 2048))
