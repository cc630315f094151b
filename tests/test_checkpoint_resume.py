"""Resume from the newest intact checkpoint: a `trainer_state.json` cut by a kill or a full disk is skipped with a
warning, and the run resumes from the checkpoint before it (train and rl both pick it with
`sft.last_complete_checkpoint`). The end-to-end case trains the tiny Qwen3 for real (TRL + PEFT, in process)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from test_train import write_recipe
from toy_sft import write_toy_sft

from maps_train.train.sft import last_complete_checkpoint


def write_checkpoint(folder: Path, step: int, state: bytes | None) -> Path:
    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    if state is not None:
        (checkpoint / "trainer_state.json").write_bytes(state)
    return checkpoint


def intact(step: int) -> bytes:
    return json.dumps({"global_step": step, "log_history": [{"step": step, "loss": 1.0}]}).encode()


def test_a_torn_newest_state_is_skipped_with_a_warning(tmp_path, caplog):
    older = write_checkpoint(tmp_path, 2, intact(2))
    torn = write_checkpoint(tmp_path, 4, intact(4)[:17])  # cut mid-write
    write_checkpoint(tmp_path, 6, None)  # a save cut before its state
    with caplog.at_level(logging.WARNING, logger="maps_train.train.sft"):
        assert last_complete_checkpoint(tmp_path) == str(older)
    [warning] = caplog.messages
    assert warning.startswith(f"{torn / 'trainer_state.json'}: torn or not JSON")


def test_no_intact_state_means_no_resume(tmp_path):
    write_checkpoint(tmp_path, 1, b"")
    write_checkpoint(tmp_path, 3, b'["not", "a", "state"]')
    write_checkpoint(tmp_path, 5, json.dumps({"global_step": "5"}).encode())
    assert last_complete_checkpoint(tmp_path) is None


def test_train_resumes_from_the_checkpoint_before_a_torn_one(tmp_path, monkeypatch, caplog):
    from maps_train.train.__main__ import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sft_dir = tmp_path / "sft"
    write_toy_sft(sft_dir)
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.yaml", sft_dir, out, sft={"max_steps": 2, "save_steps": 1})
    assert main(["--config", str(path), "--role", "writer"]) == 0
    checkpoints = out / "_trainer" / "writer"
    assert last_complete_checkpoint(checkpoints) == str(checkpoints / "checkpoint-2")
    # As a kill leaves it: the newest checkpoint's state cut short, the adapter not yet marked finished.
    state = checkpoints / "checkpoint-2" / "trainer_state.json"
    state.write_bytes(state.read_bytes()[:40])
    (out / "writer" / "train_summary.json").unlink()
    with caplog.at_level(logging.INFO):
        assert main(["--config", str(path), "--role", "writer"]) == 0
    assert any(m.startswith(f"{state}: torn or not JSON") for m in caplog.messages)
    assert any(m == f"writer: resuming from {checkpoints / 'checkpoint-1'}" for m in caplog.messages)
    assert json.loads(state.read_text())["global_step"] == 2  # step 2 trained again and saved whole
    assert json.loads((out / "writer" / "train_summary.json").read_text())["adapter"] == "writer"
