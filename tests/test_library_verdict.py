"""`train.sft` / `train.lora` are judged by TRL and PEFT themselves, and the verdict is remembered per installed
version (maps_train/library_options.py `remembered`): a recipe load after the first imports neither library, a refused
section fails every time, and another library version (or other options) asks the library again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from maps_train import library_options
from maps_train.errors import ConfigError
from maps_train.library_options import LORA, SFT, remembered
from maps_train.recipe import load_recipe


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MAPS_TRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _recipe(tmp_path, sft: str = "learning_rate: 1.0e-4", lora: str = "r: 8") -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: verdict\ntrain:\n  sft:\n    {sft}\n  lora:\n    {lora}\n")
    return str(path)


def test_a_second_load_in_a_fresh_interpreter_imports_neither_library(tmp_path, home):
    path = _recipe(tmp_path)
    probe = textwrap.dedent(f"""
        import json, sys
        from maps_train.recipe import load_recipe
        recipe = load_recipe({path!r})
        print(json.dumps({{"sft": recipe.train.sft, "lora": recipe.train.lora,
                          "imported": sorted({{"trl", "peft"}} & set(sys.modules))}}))
    """)
    env = {**os.environ, "MAPS_TRAIN_HOME": str(home)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["imported"] == ["peft", "trl"]  # the first load asks the libraries
    assert runs[1]["imported"] == []  # the second reuses their verdict
    assert runs[0]["sft"] == runs[1]["sft"] and runs[0]["lora"] == runs[1]["lora"]
    assert runs[1]["sft"]["learning_rate"] == 1.0e-4 and runs[1]["lora"]["r"] == 8
    assert sorted(p.name.split("-")[0] for p in (home / "checks").iterdir()) == ["lora", "sft"]


def test_a_refused_section_fails_every_time_and_is_never_kept(tmp_path, home):
    path = _recipe(tmp_path, sft="learning_rat: 1.0e-4")
    for _ in range(2):
        with pytest.raises(ConfigError, match="learning_rat: unknown SFTConfig field \\(did you mean 'learning_rate'\\?\\)"):
            load_recipe(path)
    assert [p.name for p in (home / "checks").glob("sft-*")] == []
    with pytest.raises(ConfigError, match="train.lora"):
        load_recipe(_recipe(tmp_path, lora="layers_pattern: layers"))  # PEFT's own value check, not a key check
    assert [p.name for p in (home / "checks").glob("lora-*")] == []


def test_another_version_or_other_options_ask_the_library_again(home, monkeypatch):
    asked = []

    def check(options):
        asked.append(dict(options))
        return {key: float(value) for key, value in options.items()}

    versions = {"trl": "1.0", "transformers": "5.0"}
    monkeypatch.setattr("importlib.metadata.version", lambda name: versions[name])
    assert remembered(SFT, "verdict", {"learning_rate": "1e-4"}, lambda: check({"learning_rate": "1e-4"})) == {"learning_rate": 1e-4}
    assert remembered(SFT, "verdict", {"learning_rate": "1e-4"}, lambda: check({"learning_rate": "1e-4"})) == {"learning_rate": 1e-4}
    assert len(asked) == 1
    versions["trl"] = "1.1"
    remembered(SFT, "verdict", {"learning_rate": "1e-4"}, lambda: check({"learning_rate": "1e-4"}))
    remembered(SFT, "verdict", {"learning_rate": "2e-4"}, lambda: check({"learning_rate": "2e-4"}))
    assert len(asked) == 3


def test_a_value_json_would_change_is_checked_again_not_reused(home):
    asked = []

    def check():
        asked.append(1)
        return {"target_modules": ("q_proj", "v_proj")}  # a tuple would come back from JSON as a list

    for _ in range(2):
        assert remembered(LORA, "verdict", {"target_modules": ["q_proj"]}, check) == {
            "target_modules": ("q_proj", "v_proj")}
    assert len(asked) == 2


def test_the_checking_code_is_part_of_the_key(home, monkeypatch, tmp_path):
    asked = []
    check = lambda: asked.append(1) or {"r": 8}  # noqa: E731
    remembered(LORA, "verdict", {"r": 8}, check)
    edited = tmp_path / "library_options.py"
    edited.write_text("# another version of the checking code\n")
    monkeypatch.setattr(library_options, "__file__", str(edited))
    remembered(LORA, "verdict", {"r": 8}, check)
    assert len(asked) == 2
