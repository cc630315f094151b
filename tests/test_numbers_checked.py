"""Numbers checked as numbers where they enter: `maps-train plan`'s machine flags, a recipe's `hardware:` and `rl:`
sections, and the model config.json files the plan sizes models from. NaN, infinities, negative counts and sizes,
booleans posing as integers: each one line naming the flag, field or key, never a traceback or a plan that "fits"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from maps_train import cli
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.plan.shapes import model_shape
from maps_train.recipe import load_recipe
from maps_train.rl.checks import check_rl_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--gpus", "-1", "--gpus: must be an integer >= 0, got -1"),
    ("--gpu-memory-gb", "nan", "--gpu-memory-gb: must be a number of gigabytes > 0 and at most 1,000,000,000, got nan"),
    ("--gpu-memory-gb", "inf", "--gpu-memory-gb: must be a number of gigabytes > 0 and at most 1,000,000,000, got inf"),
    ("--memory-gb", "-16", "--memory-gb: must be a number of gigabytes > 0 and at most 1,000,000,000, got -16.0"),
    ("--memory-gb", "0", "--memory-gb: must be a number of gigabytes > 0 and at most 1,000,000,000, got 0.0"),
])
def test_plan_flags_that_are_not_machine_sizes_are_one_line(flag, value, message, monkeypatch, capsys):
    monkeypatch.setattr(cli, "apply_runtime_defaults", lambda: None)
    monkeypatch.setattr(sys, "argv", ["maps-train", "plan", str(REPO / "recipes/demo/demo.yaml"), flag, value])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"maps-train: error: {message}\n"


@pytest.mark.parametrize(("override", "message"), [
    ("hardware.gpus=-2", "hardware.gpus: must be an integer >= 0, got -2"),
    ("hardware.gpu_memory_gb=nan", "hardware.gpu_memory_gb: must be a finite number of gigabytes > 0, got nan"),
    ("hardware.memory_gb=.inf", "hardware.memory_gb: must be a finite number of gigabytes > 0, got inf"),
    ("hardware.memory_gb=-1", "hardware.memory_gb: must be a finite number of gigabytes > 0, got -1.0"),
    ("rl.temperature=.inf", "rl.temperature: must be a finite number > 0, got inf"),
    ("rl.reward.cost_weight=-0.5", "rl.reward.cost_weight: must be a finite number >= 0, got -0.5"),
    ("rl.reward.correctness_weight=nan", "rl.reward.correctness_weight: must be a finite number >= 0, got nan"),
    ("rl.reward.cost_scale=0", "rl.reward.cost_scale: must be a finite number > 0, got 0.0"),
])
def test_recipe_numbers_out_of_range_are_refused_when_the_recipe_loads(override, message):
    with pytest.raises(ConfigError) as err:
        load_recipe(None, [override])
    assert str(err.value) == f"<defaults> (with overrides): {message}"


@pytest.mark.parametrize(("override", "message"), [
    ("rl.grpo.beta=-0.1", "rl.grpo.beta: must be a finite number >= 0, got -0.1"),
    ("rl.grpo.learning_rate=nan", "rl.grpo.learning_rate: must be a finite number > 0, got nan"),
    ("rl.grpo.learning_rate=0", "rl.grpo.learning_rate: must be a finite number > 0, got 0.0"),
    ("rl.grpo.per_device_train_batch_size=0", "rl.grpo.per_device_train_batch_size: must be an integer >= 1, got 0"),
])
def test_grpo_numbers_are_refused_before_any_model_loads(override, message):
    with pytest.raises(ConfigError) as err:
        check_rl_config(load_recipe(None, [override]))
    assert str(err.value) == message


GOOD = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 1000}


@pytest.mark.parametrize(("change", "message"), [
    ({"hidden_size": -64}, "config.json hidden_size: expected an integer >= 1, got -64"),
    ({"num_attention_heads": 0}, "config.json num_attention_heads: expected an integer >= 1, got 0"),
    ({"vocab_size": True}, "config.json vocab_size: expected an integer >= 1, got True"),
    ({"num_key_value_heads": -2}, "config.json num_key_value_heads: expected an integer >= 1, got -2"),
    ({"intermediate_size": -1}, "config.json intermediate_size: expected an integer >= 1, got -1"),
    ({"num_experts": 1.5}, "config.json num_experts: expected an integer >= 0, got 1.5"),
    ({"layer_types": "full_attention"}, "config.json layer_types: expected a list"),
])
def test_a_model_config_with_sizes_that_are_not_counts_is_one_line(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(MapsTrainError) as err:
        model_shape(str(tmp_path))
    assert str(err.value) == f"{tmp_path / 'config.json'}: {message}"


@pytest.mark.parametrize("text", ["[1, 2]", '{"hidden_size": 64', "NaN"])
def test_a_model_config_that_is_not_an_object_is_one_line(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(MapsTrainError) as err:
        model_shape(str(tmp_path))
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: config.json ")
    assert "\n" not in str(err.value)


def test_a_good_model_config_still_sizes_the_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GOOD))
    shape = model_shape(str(tmp_path))
    assert shape.parameters() > 0 and shape.head_dim == 16
