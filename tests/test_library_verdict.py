"""`train.sft`, `train.lora` and `rl.grpo` are judged by TRL and PEFT in the stage that builds their objects
(maps_train/library_options.py `check_library_sections`), not by every command: a recipe load imports neither
library and keeps nothing on disk, a refused section fails every time it is checked, and the options maps-train
reads are typed when read, with the library imported only for a default the section leaves unset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from maps_train.errors import ConfigError
from maps_train.library_options import LoraOptions, check_library_sections
from maps_train.recipe import load_recipe


def _recipe(tmp_path, sft: str = "learning_rate: 1.0e-4", lora: str = "r: 8", grpo: str = "beta: 0.0") -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: verdict\ntrain:\n  sft:\n    {sft}\n  lora:\n    {lora}\nrl:\n  grpo:\n    {grpo}\n")
    return str(path)


def _probe(code: str, home) -> dict:
    env = {**os.environ, "MAPS_TRAIN_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_recipe_load_imports_neither_library_and_keeps_nothing(tmp_path):
    path, home = _recipe(tmp_path, sft="learning_rat: 1.0e-4"), tmp_path / "home"
    seen = _probe(f"""
        import json, sys
        from maps_train.library_options import LoraOptions
        from maps_train.recipe import load_recipe
        recipe = load_recipe({path!r})
        rank = LoraOptions.of(recipe.train.lora).r  # what serve reads: stated, so no library default is needed
        print(json.dumps({{"imported": sorted({{"trl", "peft"}} & set(sys.modules)), "rank": rank}}))
    """, home)
    assert seen == {"imported": [], "rank": 8}  # a misspelt SFT key does not stop a command that never trains
    assert not (home / "checks").exists()


def test_the_train_stage_refuses_a_bad_section_every_time_naming_the_file(tmp_path):
    path = _recipe(tmp_path, sft="learning_rat: 1.0e-4")
    for _ in range(2):
        recipe = load_recipe(path)
        with pytest.raises(ConfigError, match=rf"^{path}: train.sft.learning_rat: unknown SFTConfig field "
                                              r"\(did you mean 'learning_rate'\?\)$"):
            check_library_sections(recipe, "train")


def test_the_rl_stage_checks_grpo_and_coerces_as_trl_types_it(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, grpo="max_steps: many"))
    check_library_sections(recipe, "train")  # train's sections are fine
    with pytest.raises(ConfigError, match=r"recipe.yaml: rl.grpo.max_steps: expected int, got 'many'$"):
        check_library_sections(recipe, "rl")
    recipe = load_recipe(_recipe(tmp_path, grpo="learning_rate: 1e-6"))
    assert recipe.rl.grpo["learning_rate"] == "1e-6"  # YAML 1.1 reads it as a string; TRL's annotation says float
    check_library_sections(recipe, "rl")
    assert recipe.rl.grpo["learning_rate"] == 1e-6


def test_options_read_are_typed_when_read(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, lora="r: eight"))
    with pytest.raises(ConfigError, match=r"^train.lora.r: expected int, got 'eight'$"):
        LoraOptions.of(recipe.train.lora)
