"""`train --overwrite` removes only the folders training wrote (issue 36).

Training marks the folders it creates (`sft.OUTPUT_MARKER`); `--overwrite` removes a folder only when it carries
the marker (or is a finished adapter / checkpoint folder from before markers existed) and lies where this recipe's
training writes. Anything else is a one-line error and nothing is removed.
"""

from __future__ import annotations

import json

import pytest
import yaml

from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.train import sft
from tests.toy_sft import write_toy_sft


@pytest.fixture
def recipe(tmp_path):
    return load_recipe(None, [f"train.output_dir={tmp_path / 'out'}"])


def user_folder(path):
    """A folder of someone's own files where an adapter would go."""
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("years of work")
    return path


def refused(call, starts_with: str) -> str:
    with pytest.raises(MapsTrainError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(starts_with), message
    return message


def test_overwrite_refuses_a_folder_without_the_marker(recipe, tmp_path):
    folder = user_folder(tmp_path / "out" / "writer")
    message = refused(lambda: sft.clear_adapter(recipe, "writer"), f"{folder}: --overwrite refused: it has no ")
    assert sft.OUTPUT_MARKER in message
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_overwrite_removes_what_training_marked(recipe, tmp_path):
    sft.mark_output_dirs(recipe, "writer")
    adapter, state = tmp_path / "out" / "writer", tmp_path / "out" / "_trainer" / "writer"
    assert (adapter / sft.OUTPUT_MARKER).is_file() and (state / sft.OUTPUT_MARKER).is_file()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    (state / "checkpoint-3").mkdir()
    sft.clear_adapter(recipe, "writer")
    assert not adapter.exists() and not state.exists()


def test_both_folders_go_or_neither(recipe, tmp_path):
    """A marked adapter folder stays when its trainer folder is someone else's: nothing half-removed."""
    sft.mark_output_dirs(recipe, "writer")
    state = tmp_path / "out" / "_trainer" / "writer"
    (state / sft.OUTPUT_MARKER).unlink()
    (state / "notes.txt").write_text("mine")
    refused(lambda: sft.clear_adapter(recipe, "writer"), f"{state}: --overwrite refused")
    assert (tmp_path / "out" / "writer" / sft.OUTPUT_MARKER).is_file() and (state / "notes.txt").is_file()


def test_a_link_to_a_marked_folder_elsewhere_is_not_followed(recipe, tmp_path):
    elsewhere = user_folder(tmp_path / "elsewhere")
    (elsewhere / sft.OUTPUT_MARKER).write_text("{}")  # even a copied marker does not make it ours to remove
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "writer").symlink_to(elsewhere)
    refused(lambda: sft.clear_adapter(recipe, "writer"), f"{tmp_path / 'out' / 'writer'}: --overwrite refused: it is a "
            "symbolic link")
    refused(lambda: sft.mark_output_dirs(recipe, "writer"), f"{tmp_path / 'out' / 'writer'}: training would write")
    assert (elsewhere / "thesis.tex").is_file()


def test_an_adapter_name_that_is_a_path_never_reaches_rmtree(recipe, tmp_path):
    """`--role ../victim` (or a recipe built in code) before: shutil.rmtree(<output_dir>/../victim)."""
    victim = user_folder(tmp_path / "victim")
    refused(lambda: sft.clear_adapter(recipe, "../victim"), "adapter: '../victim' is not a plain name")
    refused(lambda: sft.prepare_output_dirs(recipe, "../victim", True, sft.distributed_state()),
            "--role ../victim: not an adapter of this recipe")
    assert (victim / "thesis.tex").is_file()


def test_folders_from_before_markers(recipe, tmp_path):
    """Adapters trained before markers existed stay retrainable: a finished adapter (our train_summary.json naming
    it, beside adapter_config.json) and checkpoint-only trainer state are ours; a folder with anything else is not."""
    adapter, state = tmp_path / "out" / "writer", tmp_path / "out" / "_trainer" / "writer"
    adapter.mkdir(parents=True)
    (adapter / sft.SUMMARY_FILE).write_text(json.dumps({"adapter": "writer", "global_step": 6}))
    (adapter / "adapter_config.json").write_text("{}")
    (state / "checkpoint-6").mkdir(parents=True)
    (state / "README.md").write_text("not TRL's")
    refused(lambda: sft.clear_adapter(recipe, "writer"), f"{state}: --overwrite refused")
    (state / "README.md").unlink()
    sft.clear_adapter(recipe, "writer")
    assert not adapter.exists() and not state.exists()

    other = user_folder(tmp_path / "out" / "proposer")  # a summary of another adapter is not this one's
    (other / sft.SUMMARY_FILE).write_text(json.dumps({"adapter": "writer"}))
    (other / "adapter_config.json").write_text("{}")
    refused(lambda: sft.clear_adapter(recipe, "proposer"), f"{other}: --overwrite refused")


def test_training_marks_its_folders_and_overwrite_keeps_foreign_ones(tmp_path, monkeypatch):
    """The real entry point (`python -m maps_train.train`, tiny Qwen3, one step): the adapter and its checkpoints
    carry the marker, so `--overwrite` may remove them; a folder of someone's files where an adapter would go stops
    `--overwrite` with one line, and it is still there."""
    from maps_train.train.__main__ import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    write_toy_sft(tmp_path / "sft")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "toy", "train": {
        "student": "builtin:tiny-qwen3", "sft_dir": str(tmp_path / "sft"), "output_dir": str(tmp_path / "out"),
        "lora": {"r": 8, "lora_alpha": 16}, "sft": {"max_steps": 1, "per_device_train_batch_size": 4,
                                                    "max_length": 512, "save_steps": 1}}}))
    assert main(["--config", str(path), "--role", "writer"]) == 0
    adapter, state = tmp_path / "out" / "writer", tmp_path / "out" / "_trainer" / "writer"
    assert (adapter / sft.SUMMARY_FILE).is_file() and (adapter / sft.OUTPUT_MARKER).is_file()
    assert (state / sft.OUTPUT_MARKER).is_file() and (state / "checkpoint-1").is_dir()

    foreign = user_folder(tmp_path / "out" / "proposer")
    assert main(["--config", str(path), "--role", "proposer", "--overwrite"]) == 2
    assert (foreign / "thesis.tex").read_text() == "years of work"

    sft.clear_adapter(load_recipe(str(path)), "writer")
    assert not adapter.exists() and not state.exists()


class RankState:
    """Test double for accelerate's PartialState on one rank of several: a barrier that a failed main rank would
    never reach is recorded instead of waited on."""

    def __init__(self, is_main_process: bool):
        self.is_main_process = is_main_process
        self.barriers = 0

    def wait_for_everyone(self) -> None:
        self.barriers += 1


@pytest.mark.parametrize("overwrite", [False, True])
def test_every_rank_refuses_a_foreign_folder_before_any_barrier(recipe, tmp_path, overwrite):
    """A rank that is not the main one fails on someone else's folder too, instead of waiting at the barrier after
    `prepare_output_dirs` for a main rank that raised (a hang under accelerate launch)."""
    folder = user_folder(tmp_path / "out" / "writer")
    other_rank = RankState(is_main_process=False)
    refused(lambda: sft.prepare_output_dirs(recipe, "writer", overwrite, other_rank), f"{folder}: ")
    assert other_rank.barriers == 0 and (folder / "thesis.tex").is_file()
