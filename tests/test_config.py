"""Recipes: YAML onto dataclasses, dotted overrides, one-line errors naming file and field."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from maps_train.config.overlays import load_config
from maps_train.errors import ConfigError
from maps_train.library_options import check_library_sections
from maps_train.recipe import Recipe, load_recipe


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides(tmp_path):
    path = write(tmp_path, "name: t\nagent:\n  num_directions: 2\nroles:\n  default:\n    max_tokens: 32\n  proposer:\n    max_tokens: 64\n")
    recipe = load_recipe(str(path), ["agent.num_directions=4", "agent.decoupled=false", "train.sft.learning_rate=1e-4"])
    check_library_sections(recipe, "train")
    assert recipe.agent.num_directions == 4
    assert recipe.agent.decoupled is False
    assert recipe.train.sft["learning_rate"] == pytest.approx(1e-4)
    assert recipe.roles["proposer"].max_tokens == 64
    assert recipe.route("proposer").max_tokens == 64
    assert recipe.route("writer") is recipe.roles["default"]


def test_int_accepted_for_float_and_literal_checked(tmp_path):
    path = write(tmp_path, "train:\n  sft:\n    num_train_epochs: 2\nretrieval:\n  index_type: hnsw\n")
    recipe = load_recipe(str(path))
    check_library_sections(recipe, "train")
    epochs = recipe.train.sft["num_train_epochs"]  # coerced to SFTConfig's annotation by the train stage's check
    assert epochs == 2.0 and isinstance(epochs, float)
    with pytest.raises(ConfigError, match=r"retrieval.index_type: expected one of 'flat', 'hnsw', 'ivfpq'"):
        load_recipe(str(path), ["retrieval.index_type=annoy"])


@pytest.mark.parametrize(
    "text, message",
    [
        ("agent:\n  num_directons: 3\n", r"recipe.yaml: agent.num_directons: unknown key \(did you mean 'num_directions'\?\)"),
        ("agent:\n  num_directions: three\n", r"recipe.yaml: agent.num_directions: expected int, got 'three'"),
        ("agent:\n  decoupled: 1\n", r"agent.decoupled: expected bool"),
        ("roles:\n  proposer:\n    backend: tgi\n", r"roles.proposer.backend: expected one of"),
        ("agent: [1, 2]\n", r"recipe.yaml: agent: expected AgentConfig"),
        ("agent:\n  num_directions: [\n", r"recipe.yaml:\d+: invalid YAML"),
    ],
)
def test_bad_recipes_name_file_and_field(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(str(write(tmp_path, text)))


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  sft:\n    no_such_option: 1\n",
         r"^{path}: train.sft.no_such_option: unknown SFTConfig field$"),
        ("train:\n  sft:\n    learning_rat: 1.0e-4\n",
         r"^{path}: train.sft.learning_rat: unknown SFTConfig field \(did you mean 'learning_rate'\?\)$"),
        ("train:\n  sft:\n    max_steps: many\n", r"^{path}: train.sft.max_steps: expected int, got 'many'$"),
        ("train:\n  lora:\n    rank: 8\n", r"^{path}: train.lora.rank: unknown LoraConfig field"),
        ("train:\n  lora:\n    lora_dropout: high\n", r"^{path}: train.lora.lora_dropout: expected float"),
        ("train:\n  lora:\n    layers_pattern: layers\n", r"^{path}: train.lora: peft.LoraConfig refuses it"),
    ],
)
def test_library_options_are_checked_by_the_library_in_the_train_stage(tmp_path, text, message):
    """train.sft / train.lora keys are trl.SFTConfig / peft.LoraConfig fields, checked by the stage that builds
    those objects (not by every recipe load): a bad one is one line naming the file and the key."""
    path = write(tmp_path, text)
    recipe = load_recipe(str(path))  # loads: only the train stage reads these sections
    with pytest.raises(ConfigError, match=message.format(path=re.escape(str(path)))):
        check_library_sections(recipe, "train")


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  sft:\n    output_dir: x\n", r"^{path}: train.sft.output_dir: set by maps-train"),
        ("rl:\n  grpo:\n    num_generations: 8\n", r"^{path}: rl.grpo.num_generations: set from rl.num_generations$"),
        ("train:\n  lora_r: 8\n", r"^{path}: train.lora_r: unknown key \(did you mean 'lora.r'\?\)$"),
        ("train:\n  learning_rate: 1.0e-4\n",
         r"^{path}: train.learning_rate: unknown key \(did you mean 'sft.learning_rate'\?\)$"),
    ],
)
def test_keys_maps_train_sets_or_moved_are_refused_at_load(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message.format(path=re.escape(str(path)))):
        load_recipe(str(path))


def test_library_options_keep_our_defaults_under_the_recipes_keys(tmp_path):
    import dataclasses

    from peft import LoraConfig
    from trl import SFTConfig

    from maps_train.library_options import LORA_DEFAULTS, SFT_DEFAULTS

    assert set(SFT_DEFAULTS) <= {f.name for f in dataclasses.fields(SFTConfig)}
    assert set(LORA_DEFAULTS) <= {f.name for f in dataclasses.fields(LoraConfig)}
    path = write(tmp_path, "train:\n  sft:\n    learning_rate: 1e-4\n    neftune_noise_alpha: 5\n  lora:\n    r: 8\n")
    recipe = load_recipe(str(path))
    check_library_sections(recipe, "train")
    train = recipe.train
    assert train.sft == {**SFT_DEFAULTS, "learning_rate": 1e-4, "neftune_noise_alpha": 5.0}  # "1e-4": YAML's string
    assert train.lora == {**LORA_DEFAULTS, "r": 8}
    assert load_recipe(None).train.sft == SFT_DEFAULTS


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.yaml: no such recipe file"):
        load_recipe(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"expected KEY=VALUE"):
        load_recipe(None, ["agent.num_directions"])
    with pytest.raises(ConfigError, match=r"agent.bogus: unknown key"):
        load_config(Recipe, None, ["agent.bogus=1"])


def test_every_shipped_recipe_loads(repo_root):
    recipes = sorted((repo_root / "recipes").rglob("*.yaml"))
    recipes = [p for p in recipes if "accelerate" not in p.parts]
    assert recipes, "no recipes shipped"
    for path in recipes:
        load_recipe(str(path))


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "maps_train.cli", *args], capture_output=True, text=True)


def test_cli_config_show_and_one_line_error(tmp_path):
    path = write(tmp_path, "agent:\n  max_rounds: 4\n")
    shown = run_cli("config", "show", str(path), "agent.num_directions=5")
    assert shown.returncode == 0, shown.stderr
    assert "max_rounds: 4" in shown.stdout and "num_directions: 5" in shown.stdout
    bad = run_cli("config", "show", str(write(tmp_path, "agent:\n  max_round: 4\n")))
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert lines == [f"maps-train: error: {path}: agent.max_round: unknown key (did you mean 'max_rounds'?)"]


# ---- secrets: redacted wherever a recipe is shown or logged ----


def test_redact_secrets_masks_every_secret_looking_key():
    from maps_train.config.redaction import redact_secrets

    raw = {
        "backend": {"api_key": "sk-live", "base_urls": ["http://h/v1"], "max_tokens": 5},
        "hub": {"HF_TOKEN": "hf_x", "token": "t", "Authorization": "Bearer x", "X-Api-Key": "k", "password": "p"},
        "extra": [{"aws_secret_access_key": "s", "client_secret": "c", "refresh_token": {"nested": "t"}}],
        "empty": {"api_key": "", "token": None},
        "keys": {"sort_key": "id"},  # ends in _key: masked too (a false positive is cheaper than a leak)
        "overrides": ["agent.num_directions=4", "backend.api_key=sk-live", "hub.HF_TOKEN=", "note=token=x"],
    }
    redacted = redact_secrets(raw)
    assert redacted["backend"] == {"api_key": "***", "base_urls": ["http://h/v1"], "max_tokens": 5}
    assert set(redacted["hub"].values()) == {"***"}
    assert redacted["extra"] == [{"aws_secret_access_key": "***", "client_secret": "***", "refresh_token": "***"}]
    assert redacted["empty"] == {"api_key": "", "token": None}  # shows that nothing was set
    assert redacted["keys"] == {"sort_key": "***"}
    assert redacted["overrides"] == ["agent.num_directions=4", "backend.api_key=***", "hub.HF_TOKEN=", "note=token=x"]
    assert raw["backend"]["api_key"] == "sk-live"  # a copy: the original is untouched
    redacted["backend"]["base_urls"].append("x")
    assert raw["backend"]["base_urls"] == ["http://h/v1"]
    # a recipe dataclass is accepted as it is
    recipe = load_recipe(None, ["backend.api_key=sk-live"])
    assert redact_secrets(recipe)["backend"]["api_key"] == "***" and recipe.backend.api_key == "sk-live"


def test_api_key_defaults_to_the_environment(monkeypatch):
    from maps_train.llm.openai_backend import NO_KEY, api_key
    from maps_train.recipe import BackendConfig

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert BackendConfig().api_key == "" and api_key(BackendConfig()) == NO_KEY
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert api_key(BackendConfig()) == "sk-env"
    assert api_key(BackendConfig(api_key="sk-recipe")) == "sk-recipe"


def test_cli_config_show_redacts_and_bad_bytes_are_one_line(tmp_path):
    path = write(tmp_path, "backend:\n  api_key: sk-live-123\n")
    shown = run_cli("config", "show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "api_key: '***'" in shown.stdout and "sk-live-123" not in shown.stdout
    path.write_bytes(b"agent:\n  max_rounds: 4\n  max_rounds: 5\n")
    bad = run_cli("config", "show", str(path))
    assert bad.returncode == 2
    assert [line for line in bad.stderr.splitlines() if line.strip()] == [
        f"maps-train: error: {path}:3: duplicate key 'max_rounds' (first at line 2)"
    ]


# ---- names that become folder names ----


@pytest.mark.parametrize("name", ["nq", "2wikimultihopqa", "maps-qwen3_4b.v2", "A" * 100, "_x"])
def test_plain_names_pass(name):
    from maps_train.config.names import check_plain_name

    assert check_plain_name(name, "systems[0].name") == name


@pytest.mark.parametrize(
    "name, shown, rule",
    [
        ("..", "'..'", "; not starting with '.' or '-'"),
        (".hidden", "'.hidden'", "; not starting with '.' or '-'"),
        ("-rf", "'-rf'", "; not starting with '.' or '-'"),
        ("a/b", "'a/b'", ""),
        ("../out", "'../out'", "; not starting with '.' or '-'"),
        ("", "''", ""),
        ("a\x00b", "'a\\x00b'", ""),
        ("a b", "'a b'", ""),
        ("nq\n", "'nq\\n'", ""),
        ("x" * 101, "'" + "x" * 60 + "'...", "; at most 100 characters"),
        (None, "None", ""),
    ],
)
def test_unsafe_names_are_one_line_errors(name, shown, rule):
    from maps_train.config.names import check_plain_name

    with pytest.raises(ConfigError) as err:
        check_plain_name(name, "suite.yaml: systems[0].name")
    assert str(err.value) == (
        f"suite.yaml: systems[0].name: {shown} is not a plain name (letters, digits, '.', '_', '-'{rule})"
    )
