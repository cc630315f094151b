"""The RL reward-curve PNG (`maps_train.rl.curves`, `maps-train rl --plot-only`) on hand-written log histories,
saved by transformers' own TrainerState as the GRPO trainer saves them. No model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import TrainerState
from typer.testing import CliRunner

from maps_train.cli import app
from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.rl.curves import PANELS, metric_series, plot_rl_curves, read_log_history
from maps_train.rl.layout import RoleRun, plot_run_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def logged_step(step: int, cover_em: float, rounds: float) -> dict:
    """One GRPO logging row with the keys TRL 1.16 and maps_train.rl.rollout_func log (values made up; the keys
    are those of runs/learning-study/rl's trainer_state.json)."""
    cost = -rounds
    return {"step": step, "epoch": step / 10, "loss": 0.01, "reward": cover_em + 0.1 * cost + 0.1,
            "reward_std": 0.3, "rewards/correctness/mean": cover_em, "rewards/format/mean": 1.0,
            "rewards/cost/mean": cost, "rewards/evidence/mean": 0.5, "rewards/process/mean": 0.25,
            "kl": 0.001 * step, "entropy": 2.0,
            "completions/mean_length": 40.0, "frac_reward_zero_std": 0.0, "episode/cover_em": cover_em,
            "episode/rounds": rounds, "episode/retrievals": 2 * rounds, "episode/tokens": 3000.0 - 100 * step}


def history() -> list[dict]:
    # Ends with the row Trainer.train() appends once training is over: step, no metrics of a step.
    return [logged_step(1, 0.0, 2.0), logged_step(2, 0.25, 2.0), logged_step(3, 0.5, 1.0),
            {"step": 3, "epoch": 0.3, "train_loss": 0.01, "train_runtime": 330.0}]


def save_state(folder: Path, log_history: list[dict]) -> Path:
    """trainer_state.json as transformers writes it (Trainer.save_state, and every checkpoint)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = TrainerState(global_step=log_history[-1]["step"], log_history=log_history)
    state.save_to_json(str(folder / "trainer_state.json"))
    return folder / "trainer_state.json"


def rl_recipe(tmp_path: Path):
    return load_recipe("recipes/demo/rl.yaml", [f"rl.output_dir={tmp_path / 'rl'}"])


def test_series_are_the_logged_steps_without_the_end_of_training_row():
    assert metric_series(history(), "episode/rounds") == ([1.0, 2.0, 3.0], [2.0, 2.0, 1.0])
    assert metric_series(history(), "rewards/cost/mean") == ([1.0, 2.0, 3.0], [-2.0, -2.0, -1.0])
    assert metric_series(history(), "not/logged") == ([], [])


def test_every_panel_key_is_one_the_history_logs():
    # A renamed TRL or episode metric would leave its panel empty without any error: pin the names.
    logged = set(logged_step(1, 0.0, 1.0))
    assert {key for _, series in PANELS for key, _ in series} <= logged


def test_plot_writes_a_png_from_a_saved_trainer_state(tmp_path):
    state_file = save_state(tmp_path / "trainer", history())
    png = plot_rl_curves(read_log_history(state_file), tmp_path / "out" / "curves.png", "demo")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_a_history_without_a_reward_is_a_one_line_error(tmp_path):
    no_steps = [{"step": 0, "train_runtime": 1.0}]
    with pytest.raises(MapsTrainError, match="no logged step with a reward") as err:
        plot_rl_curves(no_steps, tmp_path / "curves.png", "demo")
    assert "\n" not in str(err.value) and not (tmp_path / "curves.png").exists()


def test_a_missing_or_malformed_state_file_is_a_one_line_error_naming_it(tmp_path):
    with pytest.raises(MapsTrainError, match="no trainer_state.json") as err:
        read_log_history(tmp_path / "trainer_state.json")
    assert str(tmp_path / "trainer_state.json") in str(err.value)
    (tmp_path / "trainer_state.json").write_text('{"log_history": ')
    with pytest.raises(MapsTrainError, match="not a Trainer state file") as err:
        read_log_history(tmp_path / "trainer_state.json")
    assert "\n" not in str(err.value)


def test_plot_only_on_an_interrupted_run_uses_its_newest_complete_checkpoint(tmp_path):
    recipe = rl_recipe(tmp_path)
    run = RoleRun.of(recipe, "consolidator")
    trainer_dir = run.trainer_dir
    save_state(trainer_dir / "checkpoint-2", history()[:2])
    save_state(trainer_dir / "checkpoint-3", history()[:3])
    (trainer_dir / "checkpoint-4").mkdir()  # killed mid-save: no trainer_state.json, not complete
    assert run.newest_trainer_state() == trainer_dir / "checkpoint-3" / "trainer_state.json"
    assert plot_run_curves(recipe) == [run.curves_png]
    assert run.curves_png.read_bytes()[:8] == PNG_MAGIC
    save_state(trainer_dir, history())  # the run finished: Trainer.save_state's file wins over the checkpoints
    assert run.newest_trainer_state() == trainer_dir / "trainer_state.json"


def test_cli_plot_only_prints_the_png_and_fails_without_a_run(tmp_path):
    overrides = [f"rl.output_dir={tmp_path / 'rl'}"]
    missing = CliRunner().invoke(app, ["rl", "recipes/demo/rl.yaml", *overrides, "--plot-only"])
    # `maps-train`'s main() prints a MapsTrainError as one line and exits 2; the app itself raises it
    assert isinstance(missing.exception, MapsTrainError) and "no trainer_state.json" in str(missing.exception)
    save_state(tmp_path / "rl" / "_trainer" / "consolidator", history())
    result = CliRunner().invoke(app, ["rl", "recipes/demo/rl.yaml", *overrides, "--plot-only"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "rl" / "curves-consolidator.png")
