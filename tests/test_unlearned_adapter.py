"""An adapter with no SFT rows (every role it serves under `sft_data.min_rows_per_role`): `sft-data` says its roles
are served by the base model, and training, serving, eval and RL keep that promise (`maps_train.train.unlearned`).

The learning study with `agent.search_question` met it for real: its writer kept 11 rows and its proposer 9, both
under the floor of 20, and `train --role all` then stopped on "no training rows". Here: real LoRA steps on the tiny
Qwen3 for the adapters with rows, in one `--role all` run beside the empty one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from toy_sft import train_without_writer_rows

from maps_train.recipe import load_recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, str]:
    """(recipe, adapters folder, what `maps-train train` printed): the toy SFT set with the writer's rows gone, as
    sft-data leaves a role under the floor (an empty train.jsonl), trained by the real `maps-train train --role all`
    command, whose launcher runs `python -m maps_train.train ...` in this process (one rank) instead of
    `accelerate launch` (the 2-rank launch is tests/test_train.py's)."""
    root = tmp_path_factory.mktemp("unlearned")
    recipe, output, launches = train_without_writer_rows(root, "toy-unlearned")
    assert len(launches) == 1 and launches[0][launches[0].index("--role") + 1] == "all"
    return recipe, root / "adapters", output


def test_an_adapter_with_no_rows_is_recorded_not_trained_and_the_others_train(trained):
    from maps_train.adapters.set import learned_nothing
    from maps_train.train.sft import is_trained

    recipe_path, adapters, printed = trained
    recipe = load_recipe(str(recipe_path))
    writer = adapters / "writer"
    summary = json.loads((writer / "train_summary.json").read_text())
    assert summary["learned"] is False and summary["train_rows"] == 0 and summary["rows_per_role"] == {"writer": 0}
    assert not (writer / "adapter_model.safetensors").exists() and not (writer / "adapter_config.json").exists()
    assert is_trained(recipe, "writer") and learned_nothing(writer)
    for adapter in ("proposer", "consolidator"):
        assert (adapters / adapter / "adapter_model.safetensors").is_file() and not learned_nothing(adapters / adapter)
        assert f"{adapters / adapter}: ok" in printed  # the vLLM checks passed
    assert f"{writer}: learned nothing (no SFT rows): the base model serves its roles" in printed


def test_a_rerun_skips_it_and_overwrite_may_remove_it(trained, tmp_path):
    from maps_train.train.__main__ import main

    recipe_path, adapters, _ = trained
    copy = tmp_path / "adapters"
    shutil.copytree(adapters, copy)
    overrides = [f"train.output_dir={copy}"]
    summary = copy / "writer" / "train_summary.json"
    summary.write_text(summary.read_text().replace('"train_rows": 0', '"train_rows": 0, "seen": true'))
    assert main(["--config", str(recipe_path), "--role", "writer", *overrides]) == 0
    assert '"seen": true' in summary.read_text()  # finished: skipped
    assert main(["--config", str(recipe_path), "--role", "writer", "--overwrite", *overrides]) == 0
    assert '"seen"' not in summary.read_text() and json.loads(summary.read_text())["learned"] is False


def test_its_roles_are_served_by_the_base_model_and_no_lora_is_loaded(trained, tiny_qwen3):
    from maps_train.adapters import distilled_set, student_routes
    from maps_train.serve.plan import check_adapters
    from maps_train.train.sft import adapter_artifacts

    recipe_path, adapters, _ = trained
    recipe = load_recipe(str(recipe_path))
    routes = student_routes(recipe, distilled_set(recipe))
    assert routes["writer"].adapter is None and routes["writer"].model == routes["proposer"].model
    assert routes["proposer"].adapter == str(adapters / "proposer")
    assert student_routes(recipe, distilled_set(recipe), via="server")["writer"].adapter is None
    _, served, _ = check_adapters(recipe, distilled_set(recipe))  # the vLLM checks, on the two adapters that have weights
    assert sorted(served) == ["consolidator", "proposer"]
    assert [folder.name for _, folder in adapter_artifacts(recipe, distilled_set(recipe))] == ["proposer", "consolidator"]


def test_rl_from_it_starts_a_fresh_lora_and_trains_its_roles(trained):
    from peft import LoraConfig, PeftModel

    from maps_train.adapters import rl_source_set
    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import load_policy_model
    from maps_train.rl.rollout import trained_trace_roles

    recipe_path, adapters, _ = trained
    recipe = load_recipe(str(recipe_path), ["rl.init=distilled"])
    writer, proposer, source = RoleRun.of(recipe, "writer"), RoleRun.of(recipe, "proposer"), rl_source_set(recipe)
    assert writer.policy_start(source) is None
    assert proposer.policy_start(source) == adapters / "proposer"
    assert trained_trace_roles(recipe, "writer") == ["writer"]
    model, lora = load_policy_model(writer, "float32", source)
    assert isinstance(lora, LoraConfig) and lora.lora_dropout == 0.0 and not isinstance(model, PeftModel)
    model, lora = load_policy_model(proposer, "float32", source)
    assert lora is None and isinstance(model, PeftModel)


def test_an_eval_swap_serves_the_roles_the_swapped_folder_learned(trained, tmp_path):
    from maps_train.evaluate.suite import apply_routes

    recipe_path, _, _ = trained
    recipe = load_recipe(str(recipe_path))
    rl_writer, rl_consolidator, elsewhere = tmp_path / "rl-writer", tmp_path / "rl-consolidator", tmp_path / "x"
    for folder, roles in ((rl_writer, ["writer"]), (rl_consolidator, ["consolidator"])):
        folder.mkdir()
        (folder / "rl_summary.json").write_text(json.dumps({"trained_roles": roles}))
    elsewhere.mkdir()
    # RL trained the writer from a fresh LoRA (its SFT adapter learned nothing): the swap serves the writer.
    routes = apply_routes(recipe, "distilled", {"writer": str(rl_writer)}).roles
    assert routes["writer"].adapter == str(rl_writer)
    # A folder with no record keeps a role where the distilled adapter left it: the writer on the base model.
    assert apply_routes(recipe, "distilled", {"writer": str(elsewhere)}).roles["writer"].adapter is None
    # An RL consolidator that trained only the consolidator's calls leaves the answer to the base model.
    routes = apply_routes(recipe, "distilled", {"consolidator": str(rl_consolidator)}).roles
    assert routes["consolidator"].adapter == str(rl_consolidator) and routes["answer"].adapter is None
    assert routes["default"].adapter == str(rl_consolidator)
