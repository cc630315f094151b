"""The adapter set (`maps_train.adapters`): the manifest `train` writes beside its adapters, and the one class that
answers which route serves each role for serve, eval and RL, from SFT (real LoRA steps on the tiny Qwen3, one
adapter that learned nothing), from RL (one role), and from a folder written before the manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file
from toy_sft import train_without_writer_rows

from maps_train.adapters import MANIFEST_FILE, AdapterSet, distilled_set, load_set
from maps_train.recipe import load_recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(recipe, adapters folder): `maps-train train --role all` on the toy SFT set with the writer's rows gone, its
    launcher running `python -m maps_train.train` in this process (one rank)."""
    root = tmp_path_factory.mktemp("adapter-set")
    recipe, _, _ = train_without_writer_rows(root, "toy-set", {"rl": {"output_dir": str(root / "rl")}})
    return recipe, root / "adapters"


def routes_of_every_stage(recipe_path: Path, overrides: list[str]) -> dict[str, dict[str, str | None]]:
    """role -> adapter, as serve (by served name), eval's `routes: distilled` and RL's environment route it."""
    from maps_train.evaluate.suite import apply_routes
    from maps_train.rl.environment import environment_recipe
    from maps_train.serve.plan import plan_server

    recipe = load_recipe(str(recipe_path), overrides)
    return {
        "serve": {role: route.adapter for role, route in plan_server(recipe).routes.items()},
        "eval": {role: route.adapter for role, route in apply_routes(recipe, "distilled").roles.items()},
        "rl": {role: route.adapter for role, route in environment_recipe(recipe).roles.items()},
    }


def test_train_writes_a_manifest_of_what_each_adapter_learned(trained):
    from maps_train.train.sft import recorded_base_model

    _, adapters = trained
    manifest = json.loads((adapters / MANIFEST_FILE).read_text())
    entries = manifest["adapters"]
    assert entries["writer"]["folder"] is None and entries["writer"]["learned"] == []
    assert entries["proposer"]["folder"] == "proposer" and entries["proposer"]["learned"] == ["proposer"]
    assert sorted(entries["consolidator"]["roles"]) == ["answer", "consolidator"]
    digest = entries["proposer"]["sha256"]
    assert digest == hashlib.sha256((adapters / "proposer" / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert manifest["base_model"] == recorded_base_model("builtin:tiny-qwen3")
    assert manifest["lineage"]["sft_set"].endswith("sft") and manifest["lineage"]["student"] == "builtin:tiny-qwen3"


def test_every_stage_routes_an_sft_set_alike(trained):
    recipe_path, adapters = trained
    routes = routes_of_every_stage(recipe_path, [])
    folder = {role: routes["eval"][role] for role in routes["eval"]}
    assert folder["proposer"] == str(adapters / "proposer")
    assert folder["consolidator"] == folder["answer"] == folder["default"] == str(adapters / "consolidator")
    assert folder["writer"] is None  # learned nothing: the base model
    assert routes["rl"] == folder
    assert routes["serve"] == {role: None if path is None else Path(path).name for role, path in folder.items()}


def test_a_folder_from_before_the_manifest_routes_as_its_records_say(trained, tmp_path):
    recipe_path, adapters = trained
    old = tmp_path / "old"
    shutil.copytree(adapters, old)
    (old / MANIFEST_FILE).unlink()
    recipe = load_recipe(str(recipe_path), [f"serve.adapters_dir={old}"])
    legacy, current = distilled_set(recipe), AdapterSet.load(adapters, {})
    assert not legacy.from_manifest and current.from_manifest
    for role in ("proposer", "writer", "consolidator", "answer", "default"):
        expected = current.folder_of(role)
        assert legacy.folder_of(role) == (None if expected is None else old / expected.name)
    routes = routes_of_every_stage(recipe_path, [f"serve.adapters_dir={old}"])
    assert routes["eval"]["writer"] is None and routes["rl"]["proposer"] == str(old / "proposer")


def test_an_rl_set_serves_its_rl_adapter_for_the_roles_it_trained(trained, tmp_path):
    """RL of the consolidator (its answer role left to the base model: it trained only the consolidator's calls)
    leaves a whole set: the RL adapter and the SFT set's others; serve, eval and RL read it as one."""
    from maps_train.rl.layout import RoleRun

    recipe_path, adapters = trained
    recipe = load_recipe(str(recipe_path))
    run = RoleRun.of(recipe, "consolidator")
    rl_folder = run.adapter_dir
    shutil.copytree(adapters / "consolidator", rl_folder)  # the weights RL would save, and its record
    (rl_folder / "train_summary.json").unlink()
    (rl_folder / "rl_summary.json").write_text(json.dumps({"trained_roles": ["consolidator"]}))
    rl_set = run.with_rl_adapter(distilled_set(recipe), ["consolidator"], str(adapters / "x"))
    rl_set.write()
    reread = load_set(rl_folder.parent, recipe)
    assert reread.from_manifest and reread.adapter_of("consolidator").stage == "rl"
    routes = routes_of_every_stage(recipe_path, [f"serve.adapters_dir={rl_folder.parent}"])
    assert routes["eval"]["consolidator"] == routes["eval"]["default"] == str(rl_folder)
    assert routes["eval"]["answer"] is None and routes["eval"]["writer"] is None
    assert routes["eval"]["proposer"] == str(adapters / "proposer")  # outside the set: an absolute folder
    assert routes["rl"] == routes["eval"]
    # The same through eval's swap of one folder, the distilled set otherwise.
    from maps_train.evaluate.suite import apply_routes

    swapped = apply_routes(recipe, "distilled", {"consolidator": str(rl_folder)}).roles
    assert {role: route.adapter for role, route in swapped.items()} == routes["eval"]


def test_rl_policy_and_environment_start_from_the_same_adapters(trained, tmp_path):
    """With serve.adapters_dir set and rl.adapters_dir unset, RL's policy and its environment come from one set
    (on main the policy read train.output_dir and the environment serve.adapters_dir: two students)."""
    from peft import PeftModel

    from maps_train.adapters import rl_source_set
    from maps_train.rl.environment import environment_recipe
    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import load_policy_model

    recipe_path, adapters = trained
    served = tmp_path / "served"
    shutil.copytree(adapters, served)
    (served / MANIFEST_FILE).unlink()  # the set as copied by hand, records only
    overrides = [f"serve.adapters_dir={served}", f"train.output_dir={tmp_path / 'elsewhere'}"]
    recipe = load_recipe(str(recipe_path), overrides)
    environment = environment_recipe(recipe)
    assert environment.route("proposer").adapter == str(served / "proposer")
    model, lora = load_policy_model(RoleRun.of(recipe, "proposer"), "float32", rl_source_set(recipe))
    assert lora is None and isinstance(model, PeftModel)
    saved = load_file(str(served / "proposer" / "adapter_model.safetensors"))
    state = {key: value for key, value in model.state_dict().items() if "lora_" in key}
    name = next(iter(saved))
    loaded = next(value for key, value in state.items() if key.replace(".default", "") == name)
    assert loaded.equal(saved[name])


def test_adapters_check_says_when_a_folder_learned_nothing(trained):
    from typer.testing import CliRunner

    from maps_train.cli import app

    _, adapters = trained
    result = CliRunner().invoke(app, ["adapters", "check", str(adapters / "writer"), str(adapters / "proposer")])
    assert result.exit_code == 1
    assert f"{adapters / 'writer'}: learned nothing" in result.output
    assert f"{adapters / 'proposer'}: ok" in result.output and f"{adapters / 'writer'}: ok" not in result.output


def test_a_real_rl_run_leaves_a_set_that_serves_its_rl_adapter(tmp_path, tiny_qwen3, make_lora_adapters):
    """One GRPO step on the consolidator (the real `rl_stage`, in this process): `<rl.output_dir>/adapters/` holds
    the RL adapter and a manifest that routes its trained roles to it, its parent the distilled adapter."""
    from test_rl_train import write_world

    from maps_train.rl.trainer import rl_stage

    distilled = Path(make_lora_adapters(tiny_qwen3, ["consolidator"])["consolidator"])
    recipe = load_recipe(str(write_world(tmp_path, distilled.parent)), ["rl.grpo.max_steps=1"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        overall = rl_stage(recipe)
    out = tmp_path / "rl" / "adapters" / "consolidator"
    left = AdapterSet.load(out.parent, {})
    assert left.from_manifest and left.folder_of("consolidator") == left.folder_of("default") == out
    assert left.adapter_of("consolidator").parent == str(distilled)
    assert left.adapter_of("consolidator").sha256 == overall["lineage"][0]["rl_sha256"]
    assert left.folder_of("proposer") == distilled.parent / "proposer"  # the starting set's, where it lies


def test_a_set_without_a_consolidator_adapter_sends_the_other_roles_to_the_base_model(tmp_path):
    """The distillation study's set: adapters that learned only the proposer and the writer. Every other role (the
    consolidator, the answer: the default route) is the base model's, never the first adapter's (it was the
    proposer's, which then wrote the consolidator's and the answer's JSON)."""
    from maps_train.adapters.set import Adapter
    from maps_train.recipe import RoleRoute

    adapters = {name: Adapter(name, tmp_path / name, (name,), learned=(name,)) for name in ("proposer", "writer")}
    routes = AdapterSet(tmp_path, adapters).routes(RoleRoute(backend="vllm", model="x"), "base", False)
    assert routes["proposer"].adapter == str(tmp_path / "proposer")
    assert routes["writer"].adapter == str(tmp_path / "writer")
    assert routes["default"].adapter is None and routes["default"].model == "base"
    assert "consolidator" not in routes and "answer" not in routes  # they take the default route
    served = AdapterSet(tmp_path, adapters).routes(RoleRoute(backend="vllm", model="x"), "base", False, via="server")
    assert served["writer"].adapter == "writer" and served["default"].adapter is None
