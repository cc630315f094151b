"""The libraries own their options: `train.sft`, `train.lora` and `rl.grpo` name only where maps-train departs from
TRL's and PEFT's defaults, and every option maps-train reads resolves to what the library's own config object
holds (maps_train/library_options.py), so the plan, sft-data and the trainers read one value."""

from __future__ import annotations

import dataclasses

import pytest
from peft import LoraConfig
from trl import GRPOConfig, SFTConfig

from maps_train.library_options import (
    GRPO,
    GRPO_DEFAULTS,
    LORA,
    LORA_DEFAULTS,
    SFT,
    SFT_DEFAULTS,
    GRPOOptions,
    LoraOptions,
    SFTOptions,
    library_defaults,
)
from maps_train.recipe import load_recipe

RECIPES = [None, "recipes/demo/demo.yaml", "recipes/demo/rl.yaml", "recipes/distill/qwen3-4b.yaml"]


def declared_default(cls: type, name: str):
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


@pytest.mark.parametrize(("cls", "ours"), [(SFTConfig, SFT_DEFAULTS), (LoraConfig, LORA_DEFAULTS),
                                           (GRPOConfig, GRPO_DEFAULTS)], ids=["sft", "lora", "grpo"])
def test_each_of_our_defaults_is_a_library_field_that_departs_from_the_librarys_default(cls, ours):
    names = {f.name for f in dataclasses.fields(cls)}
    assert set(ours) <= names
    restated = {key: value for key, value in ours.items() if declared_default(cls, key) == value}
    assert restated == {}, f"equal to {cls.__name__}'s own default, so the library should own them: {restated}"


@pytest.mark.parametrize(("section", "cls"), [(SFT, SFTConfig), (LORA, LoraConfig), (GRPO, GRPOConfig)],
                         ids=["sft", "lora", "grpo"])
def test_library_defaults_are_the_dataclass_fields_defaults(section, cls):
    defaults = library_defaults(section)
    assert defaults, "no defaults read"
    for name, value in defaults.items():
        assert declared_default(cls, name) == value, name
    assert library_defaults.__wrapped__(section) == defaults  # read again from the library: the same


@pytest.mark.parametrize("path", RECIPES)
def test_the_options_maps_train_reads_are_the_library_objects_values(path, tmp_path):
    recipe = load_recipe(path)
    sft = SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, **recipe.train.sft)
    for field in dataclasses.fields(SFTOptions):
        assert getattr(SFTOptions.of(recipe.train.sft), field.name) == getattr(sft, field.name), field.name
    lora = LoraConfig(**recipe.train.lora)
    for field in dataclasses.fields(LoraOptions):
        assert getattr(LoraOptions.of(recipe.train.lora), field.name) == getattr(lora, field.name), field.name
    grpo = GRPOConfig(output_dir=str(tmp_path / "grpo"), use_cpu=True, num_generations=recipe.rl.num_generations,
                      **recipe.rl.grpo)
    for field in dataclasses.fields(GRPOOptions):
        assert getattr(GRPOOptions.of(recipe.rl.grpo), field.name) == getattr(grpo, field.name), field.name


def test_rl_trains_with_trls_gradient_checkpointing_when_the_recipe_is_silent(tmp_path):
    """TRL's GRPOConfig checkpoints by default; the demo's RL recipe does not say: the trainer's GRPOConfig and the
    options every stage reads agree (the plan once read the unset key as off)."""
    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import build_grpo_config

    recipe = load_recipe("recipes/demo/rl.yaml", [f"rl.output_dir={tmp_path}"])
    assert "gradient_checkpointing" not in recipe.rl.grpo
    args = build_grpo_config(RoleRun.of(recipe, "consolidator"), bf16=False, wandb_on=False)
    assert args.gradient_checkpointing is True
    assert GRPOOptions.of(recipe.rl.grpo).gradient_checkpointing is True
    off = load_recipe("recipes/demo/rl.yaml", [f"rl.output_dir={tmp_path}", "rl.grpo.gradient_checkpointing=false"])
    assert build_grpo_config(RoleRun.of(off, "consolidator"), bf16=False, wandb_on=False).gradient_checkpointing is False
    assert GRPOOptions.of(off.rl.grpo).gradient_checkpointing is False


def test_a_section_holds_only_what_the_recipe_sets_over_our_departures():
    recipe = load_recipe(None, ["train.sft.max_steps=3", "rl.grpo.beta=0.0"])
    assert recipe.train.sft == {**SFT_DEFAULTS, "max_steps": 3}
    assert recipe.rl.grpo == {**GRPO_DEFAULTS, "beta": 0.0}
    assert "per_device_train_batch_size" not in recipe.train.sft  # TRL's 8: the library's to say
    assert SFTOptions.of(recipe.train.sft).per_device_train_batch_size == declared_default(
        SFTConfig, "per_device_train_batch_size")
