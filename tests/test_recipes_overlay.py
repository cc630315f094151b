"""Recipe overlays (`base:`): one teacher recipe, short student recipes over it, and where their SFT sets go."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from maps_train.errors import ConfigError
from maps_train.recipe import load_recipe, sft_set_dir, sft_traces_dir, train_sft_dir

REPO = Path(__file__).resolve().parent.parent


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


TEACHER = """name: teacher
roles:
  default: {model: big-teacher, max_tokens: 64}
  reasoner: {model: big-teacher, max_tokens: 512}
agent: {num_directions: 3, max_rounds: 4}
traces:
  questions: [a.jsonl, b.jsonl]
  out_dir: runs/teacher/traces
"""


def test_overlay_deep_merges_mappings_and_replaces_lists_and_scalars(tmp_path):
    write(tmp_path / "teacher" / "t.yaml", TEACHER)
    student = write(tmp_path / "distill" / "s.yaml", """base: ../teacher/t.yaml
name: student
roles:
  default: {max_tokens: 32}
agent: {max_rounds: 2}
traces:
  questions: [c.jsonl]
""")
    recipe = load_recipe(str(student))
    assert recipe.name == "student"
    assert (recipe.roles["default"].model, recipe.roles["default"].max_tokens) == ("big-teacher", 32)  # key by key
    assert recipe.roles["reasoner"].max_tokens == 512  # a route the overlay does not name stays
    assert (recipe.agent.num_directions, recipe.agent.max_rounds) == (3, 2)
    assert recipe.traces.questions == ["c.jsonl"] and recipe.traces.out_dir == "runs/teacher/traces"  # lists replace
    # Overrides still apply last.
    assert load_recipe(str(student), ["agent.max_rounds=7"]).agent.max_rounds == 7


def test_chains_and_errors_name_the_file_and_key(tmp_path):
    write(tmp_path / "a.yaml", "agent:\n  num_directons: 3\n")
    write(tmp_path / "b.yaml", "base: a.yaml\nagent:\n  max_rounds: 2\n")
    c = write(tmp_path / "sub" / "c.yaml", "base: ../b.yaml\nname: c\n")
    # The bad key sits two files down the chain: the error names that file, not the one given.
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'a.yaml'))}: agent.num_directons: unknown key"):
        load_recipe(str(c))
    write(tmp_path / "a.yaml", "agent:\n  num_directions: 3\n")
    assert load_recipe(str(c)).agent.num_directions == 3 and load_recipe(str(c)).agent.max_rounds == 2
    # A key the overlay gets wrong names the overlay.
    bad = write(tmp_path / "d.yaml", "base: b.yaml\nagent:\n  max_rounds: many\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: agent.max_rounds: expected int"):
        load_recipe(str(bad))


@pytest.mark.parametrize(
    "files, message",
    [
        ({"x.yaml": "base: y.yaml\n", "y.yaml": "base: x.yaml\n"}, r"x.yaml: base: recipes that are each other's base"),
        ({"x.yaml": "base: x.yaml\n"}, r"x.yaml: base: recipes that are each other's base"),
        ({"x.yaml": "base: nope.yaml\n"}, r"x.yaml: base: .*nope.yaml: no such recipe file"),
        ({"x.yaml": "base: [a, b]\n"}, r"x.yaml: base: expected the path of a recipe file"),
    ],
)
def test_bad_bases_are_one_line(tmp_path, files, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_recipe(str(tmp_path / "x.yaml"))
    assert "\n" not in str(err.value)


def test_config_show_prints_the_merged_recipe(tmp_path):
    write(tmp_path / "teacher.yaml", TEACHER)
    student = write(tmp_path / "student.yaml", "base: teacher.yaml\nname: student\ntrain:\n  sft:\n    max_steps: 3\n")
    shown = subprocess.run([sys.executable, "-m", "maps_train.cli", "config", "show", str(student)],
                           capture_output=True, text=True, cwd=REPO)
    assert shown.returncode == 0, shown.stderr
    merged = yaml.safe_load(shown.stdout)
    assert merged["name"] == "student" and "base" not in merged
    assert merged["roles"]["default"]["model"] == "big-teacher" and merged["traces"]["out_dir"] == "runs/teacher/traces"
    assert merged["train"]["sft"]["max_steps"] == 3 and merged["train"]["sft"]["learning_rate"] == 2e-4  # our default


def test_shipped_students_share_one_teacher_run_and_one_sft_set(monkeypatch):
    # sft-data fits rows to train.sft.max_length with the student's tokenizer, so its identity keys the set. The hub
    # tokenizers are not here offline; Qwen3-0.6B to 8B ship one tokenizer and template, hence one identity.
    monkeypatch.setattr("maps_train.recipe.tokenizer_identity", lambda name: name.removesuffix(name.split("-")[-1]))
    teacher = load_recipe(str(REPO / "recipes" / "teacher" / "qwen3-32b.yaml"))
    students = [load_recipe(str(path)) for path in sorted((REPO / "recipes" / "distill").glob("*.yaml"))]
    assert len(students) == 4
    for student in students:
        raw = yaml.safe_load((REPO / "recipes" / "distill" / f"{student.name.removeprefix('distill-')}.yaml").read_text())
        assert raw["base"] == "../teacher/qwen3-32b.yaml" and set(raw) <= {"base", "name", "backend", "train", "onpolicy", "rl", "wandb"}
        assert student.roles == teacher.roles and student.traces == teacher.traces and student.agent == teacher.agent
        assert sft_traces_dir(student) == Path(teacher.traces.out_dir)
        # One tokenizer and one max_length: all four read one set.
        assert train_sft_dir(student) == sft_set_dir(student) == sft_set_dir(students[0])
        assert sft_set_dir(student).parent == Path(teacher.traces.out_dir) / "sft"
        assert len({s.train.output_dir for s in students}) == 4
    assert len({s.train.student for s in students}) == 4


def test_sft_set_folder_is_keyed_by_row_settings_and_template_only_with_caps(tmp_path, tiny_qwen3, smollm2):
    base = [f"traces.out_dir={tmp_path / 'traces'}", "train.sft.max_length=null"]  # null: TRL cuts no row
    tiny = load_recipe(None, [*base, f"train.student={tiny_qwen3}"])
    smol = load_recipe(None, [*base, f"train.student={smollm2}"])
    assert sft_set_dir(tiny) == sft_set_dir(smol)  # message lists: any template renders them
    assert sft_set_dir(load_recipe(None, [*base, "sft_data.require_correct=false"])) != sft_set_dir(tiny)
    capped = ["sft_data.max_prompt_tokens=512"]
    tiny_capped = load_recipe(None, [*base, *capped, f"train.student={tiny_qwen3}"])
    smol_capped = load_recipe(None, [*base, *capped, f"train.student={smollm2}"])
    assert sft_set_dir(tiny_capped) != sft_set_dir(smol_capped)  # token caps count with each tokenizer
    assert sft_set_dir(tiny_capped) != sft_set_dir(tiny)
    same_template = load_recipe(None, [*base, *capped, "train.student=builtin:tiny-qwen3"])
    assert sft_set_dir(same_template) == sft_set_dir(tiny_capped)  # by identity, not by name
    explicit = load_recipe(None, [*base, f"sft_data.out_dir={tmp_path / 'mine'}"])
    assert sft_set_dir(explicit) == train_sft_dir(explicit) == tmp_path / "mine"
