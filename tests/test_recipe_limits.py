"""Recipes that would write outside the run, hang or blow the stack are one-line `ConfigError`s when they load.

Each test is a reproducer of issue 36: names that become folders (adapters, roles, the run name, questions files)
are plain names, and self-referencing YAML, alias bombs, oversized files, long or cyclic `base:` chains, very deep
dotted overrides and mappings of many keys are refused in bounded time, never with a RecursionError.
"""

from __future__ import annotations

import itertools
import json
import string
import subprocess
import sys

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after
from typer.testing import CliRunner

from maps_train.config.overlays import MAX_BASE_CHAIN
from maps_train.config.yaml_io import MAX_YAML_BYTES, MAX_YAML_KEYS
from maps_train.errors import ConfigError
from maps_train.recipe import load_recipe


def refused(path, overrides=(), starts_with: str | None = None) -> str:
    """Load `path` expecting a one-line ConfigError that starts with `starts_with` (default: the file's name)."""
    with pytest.raises(ConfigError) as caught:
        load_recipe(str(path) if path is not None else None, list(overrides))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(starts_with or str(path)), message
    return message


# --- names that become folders -------------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ["../../X", "/abs/escaped", "..", "a/b", ".hidden", ""])
def test_adapter_names_that_are_paths_are_refused_at_load(tmp_path, adapter):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"sft_data:\n  adapter_roles:\n    {json.dumps(adapter)}: [proposer]\n")
    message = refused(recipe)
    assert message.startswith(f"{recipe}: sft_data.adapter_roles: {adapter!r} is not a plain name ("), message


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        (["sft_data.adapter_roles={proposer: [../x]}"], "sft_data.adapter_roles.proposer: '../x' is not a plain name"),
        (["sft_data.adapter_roles={_trainer: [writer]}"], "sft_data.adapter_roles: '_trainer' is the folder of"),
        (["roles={../r: {max_tokens: 8}}"], "roles: '../r' is not a plain name"),
        (["name=../run"], "name: '../run' is not a plain name"),
        (["traces.questions=[data/q.jsonl, ..]"], "traces.questions[1]: '..' does not name a questions file"),
    ],
)
def test_every_name_that_becomes_a_path_is_checked(overrides, where):
    message = refused(None, overrides, starts_with="<defaults> (with overrides): ")
    assert where in message, message


@pytest.fixture
def one_trace(tmp_path):
    """A real traces folder (the MAPS engine over a scripted backend, one question answered right)."""
    questions = tmp_path / "train.jsonl"
    questions.write_text(json.dumps({"id": "q0", "question": "Who is q0?", "golden_answers": ["answer of q0"]}) + "\n")
    good = load_recipe(None, [f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / 'traces'}",
                              "agent.num_directions=2"])
    from maps_train.traces.collect import collect_traces

    collect_traces(good, backend=ScriptedBackend({"consolidator": consolidator_sufficient_after(1)}),
                   retriever=RecordingRetriever(), progress=False)
    return tmp_path


def files_under(folder) -> set[str]:
    return {str(path) for path in folder.rglob("*")}


def test_sft_data_with_an_escaping_adapter_writes_nothing_anywhere(one_trace):
    """Before: `maps-train sft-data` wrote <out>/../../escaped/train.jsonl and <abs>/train.jsonl."""
    from maps_train.cli import app

    outside = one_trace.parent / f"{one_trace.name}-escaped"
    before = files_under(one_trace)
    for key in ("../../escaped", str(outside)):
        recipe = one_trace / "recipe.yaml"
        recipe.write_text(
            f"traces:\n  out_dir: {one_trace / 'traces'}\nsft_data:\n  out_dir: {one_trace / 'sft' / 'set'}\n"
            f"  adapter_roles:\n    {json.dumps(key)}: [proposer]\ntrain:\n  student: builtin:tiny-qwen3\n"
        )
        result = CliRunner().invoke(app, ["sft-data", str(recipe)])
        assert isinstance(result.exception, ConfigError), result.output
        assert "sft_data.adapter_roles" in str(result.exception)
    assert not outside.exists() and not (one_trace / "escaped").exists()
    assert files_under(one_trace) == before | {str(one_trace / "recipe.yaml")}


def test_train_overwrite_with_an_escaping_adapter_removes_nothing(tmp_path):
    """Before: `python -m maps_train.train --overwrite` (what `maps-train train` launches) ran shutil.rmtree on
    <train.output_dir>/../victim before it read any data."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"train:\n  output_dir: {tmp_path / 'adapters'}\nsft_data:\n  adapter_roles:\n"
                      "    ../victim: [proposer]\n")
    run = subprocess.run([sys.executable, "-m", "maps_train.train", "--config", str(recipe), "--role", "../victim",
                          "--overwrite"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "sft_data.adapter_roles: '../victim' is not a plain name" in run.stderr
    assert (victim / "precious.txt").read_text() == "keep me"
    assert not (tmp_path / "adapters").exists()


# --- YAML that loops, explodes or nests too deep --------------------------------------------------------------------


def test_self_referencing_yaml_is_one_line(tmp_path):
    recipe = tmp_path / "self.yaml"
    recipe.write_text("agent: &a {x: *a}\n")
    assert "alias *a refers to a node that contains it (a cycle)" in refused(recipe)


def test_billion_laughs_is_refused_before_it_expands(tmp_path):
    """`train.sft` takes any value, and its check serialises the options first: 9**9 strings once expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]" for prev, name in zip("abcdefgh", "bcdefghi")]
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text("train:\n  sft:\n" + "".join(f"    {line}\n" for line in lines))
    assert "invalid YAML (expands to more than 100000 nodes through aliases)" in refused(recipe)


def test_aliases_cannot_nest_past_the_depth_limit(tmp_path):
    """Each anchor nests 40 levels around the previous one: 1,200 levels once expanded, past Python's recursion
    limit in every step that walks the recipe (merge, checks, dumps)."""
    lines = [f"x{i}: &x{i} " + "{a: " * 40 + (f"*x{i - 1}" if i else "1") + "}" * 40 for i in range(30)]
    recipe = tmp_path / "deep.yaml"
    recipe.write_text("train:\n  sft:\n" + "".join(f"    {line}\n" for line in lines))
    assert "nested deeper than 64 levels through aliases" in refused(recipe)


def test_a_deeply_nested_override_is_one_line():
    message = refused(None, ["train.sft." + ".".join(["a"] * 10_000) + "=1"], starts_with="override 'train.sft.a.a")
    assert message.endswith("10002 dotted levels (limit 16)") and len(message) < 200


def test_a_recipe_file_over_the_size_limit_is_refused_unread(tmp_path):
    recipe = tmp_path / "huge.yaml"
    recipe.write_text("# padding\n" * (MAX_YAML_BYTES // 10 + 1))
    assert refused(recipe) == f"{recipe}: larger than {MAX_YAML_BYTES} bytes, the limit of a recipe file"


def test_40k_top_level_keys_stop_at_the_key_cap(tmp_path):
    """40,000 keys (was 111 s, quadratic in the key count) stop at the 10,001st: one line naming that line."""
    alphabet = string.ascii_lowercase + string.digits
    keys = ["".join(chars) for chars in itertools.islice(itertools.product(alphabet, repeat=3), 40_000)]
    recipe = tmp_path / "keys.yaml"
    recipe.write_text("".join(f"{key}:\n" for key in keys))  # 200 KB: under the size limit
    assert refused(recipe) == f"{recipe}:{MAX_YAML_KEYS + 1}: invalid YAML (a mapping with more than {MAX_YAML_KEYS} keys)"


def test_a_200_file_base_chain_is_one_line(tmp_path):
    for i in range(200):
        (tmp_path / f"r{i}.yaml").write_text(f"base: r{i + 1}.yaml\n" if i < 199 else "name: bottom\n")
    message = refused(tmp_path / "r0.yaml", starts_with=str(tmp_path / f"r{MAX_BASE_CHAIN - 1}.yaml"))
    assert message.endswith(f"base: a chain of more than {MAX_BASE_CHAIN} recipes (from {tmp_path / 'r0.yaml'})")


def test_a_cyclic_base_chain_is_one_line(tmp_path):
    for i in range(3):
        (tmp_path / f"c{i}.yaml").write_text(f"base: c{(i + 1) % 3}.yaml\n")
    assert "base: recipes that are each other's base" in refused(tmp_path / "c0.yaml")


# ---- settings the chosen method never reads, and rounds without a bound (issue 65) ----


def test_min_rounds_with_a_method_that_never_reads_it_is_a_one_line_warning(caplog):
    from maps_train.recipe import load_recipe

    with caplog.at_level("WARNING", logger="maps_train.recipe"):
        load_recipe(None, ["agent.method=vanilla", "agent.min_rounds=2"])
        load_recipe(None, ["agent.method=maps", "agent.min_rounds=2"])
    assert [r.getMessage() for r in caplog.records] == [
        "maps-train: warning: agent.min_rounds: 2 is read by MAPS only; agent.method vanilla never uses it"]


@pytest.mark.parametrize("rounds", ["1000000000", "0", "101"])
def test_max_rounds_is_bounded(rounds):
    from maps_train.errors import ConfigError
    from maps_train.recipe import load_recipe

    with pytest.raises(ConfigError, match=rf"agent: max_rounds must be from 1 to 100, got {rounds}$"):
        load_recipe(None, [f"agent.max_rounds={rounds}", f"agent.min_rounds={rounds}"])
