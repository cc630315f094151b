"""Every field of every recipe section says what it means (TRL style `metadata={"help": ...}`), and `config show
--explain` prints it beside the field's type, default, value and the file that set it (maps_train/config/explain.py,
which the docs' recipe reference is generated from)."""

from __future__ import annotations

import subprocess
import sys

from maps_train.config.explain import SECTION_STAGES, explain_rows, redacted
from maps_train.config.overlays import load_config_with_sources
from maps_train.recipe import Recipe


def test_every_field_of_every_section_has_a_description():
    rows = explain_rows(Recipe)
    missing = [row.key for row in rows if not row.help.strip()]
    assert missing == [], f"fields without metadata={{'help': ...}}: {missing}"
    assert len(rows) > 150 and {"roles.<role>.model", "agent.sampling.seed", "rl.reward.cost_weight"} <= {
        row.key for row in rows}


def test_every_section_names_the_stages_that_read_it():
    assert {row.key.split(".")[0] for row in explain_rows(Recipe)} == set(SECTION_STAGES)


def test_rows_name_the_file_of_the_base_chain_that_set_each_value(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("agent:\n  max_rounds: 4\nroles:\n  writer:\n    max_tokens: 64\n")
    top = tmp_path / "top.yaml"
    top.write_text("base: base.yaml\nagent:\n  num_directions: 2\nbackend:\n  api_key: sk-live\n")
    recipe, sources = load_config_with_sources(Recipe, top, ["agent.top_k=4"])
    rows = {row.key: row for row in redacted(explain_rows(recipe, sources))}
    assert (rows["agent.max_rounds"].value, rows["agent.max_rounds"].source) == (4, str(base))
    assert (rows["agent.num_directions"].value, rows["agent.num_directions"].source) == (2, str(top))
    assert (rows["agent.top_k"].value, rows["agent.top_k"].source) == (4, "override")
    assert (rows["agent.batch_size"].value, rows["agent.batch_size"].source) == (64, "default")
    assert rows["roles.writer.max_tokens"].source == str(base) and rows["roles.writer.max_tokens"].default == 256
    assert rows["backend.api_key"].value == "***"
    assert rows["agent.num_directions"].type == "int" and rows["agent.concurrency"].type == "int or null"


def test_cli_config_show_explain(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("agent:\n  max_rounds: 4\nbackend:\n  api_key: sk-live-123\n")
    shown = subprocess.run([sys.executable, "-m", "maps_train.cli", "config", "show", str(path), "--explain",
                            "--section", "agent"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("# agent: read by run, traces, eval")
    at = lines.index("agent.max_rounds  (int)")
    assert lines[at + 1].split() == ["value:", "4", "default:", "10", "from:", str(path)]
    assert lines[at + 2].strip() == "MAPS: most search rounds per question."
    assert not any(line.startswith("backend.") for line in lines)
    every = subprocess.run([sys.executable, "-m", "maps_train.cli", "config", "show", str(path), "--explain"],
                           capture_output=True, text=True)
    assert "sk-live-123" not in every.stdout and 'value: "***"' in every.stdout
