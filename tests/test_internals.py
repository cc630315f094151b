"""Every access past vLLM's public API lives in maps_train/llm/vllm_internals.py and every one past TRL's in
maps_train/train/internals.py (an AST scan of the package); the TRL versions those were written against are the
bounds pyproject.toml declares; and maps-train's vLLM plugin (the grouped CPU LoRA ops) acts only in maps-train's
own processes, not in every vLLM process of the environment."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from maps_train.train import internals

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "maps_train"
INTERNALS = (PACKAGE / "llm" / "vllm_internals.py", PACKAGE / "train" / "internals.py")
STDLIB_PRIVATE = {"os._Environ"}  # a type the standard library documents
# Undocumented attributes of vLLM's and TRL's objects: the engine an `LLM` steps, its core's client, the worker's
# model runner, GRPOTrainer's vLLM generation and its client.
PRIVATE_NAMES = {"llm_engine", "engine_core", "model_executor", "driver_worker", "vllm_generation", "vllm_client"}
LIBRARIES = ("vllm", "trl")
MUTATORS = {"pop", "update", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"}


def _is_sys_modules(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def _library_names(tree: ast.AST) -> set[str]:
    """Names a module binds to vLLM's or TRL's modules and objects (`import vllm.x as y`, `from trl.z import w`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in LIBRARIES}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in LIBRARIES:
            names |= {a.asname or a.name for a in node.names}
    return names


def private_accesses(source: str, where: str = "<source>") -> list[str]:
    """Each access past a library's public names in `source`: a `_private` attribute of anything but self/cls, an
    attribute of `PRIVATE_NAMES` (also through getattr/setattr/hasattr), an edit of `sys.modules`, and a patch (an
    attribute set or deleted) of a name imported from vLLM or TRL."""
    tree = ast.parse(source)
    patched, found = _library_names(tree), []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else type(node.value).__name__
            if node.attr.startswith("_") and not node.attr.startswith("__") and owner not in ("self", "cls") \
                    and f"{owner}.{node.attr}" not in STDLIB_PRIVATE:
                hit(node, f"{owner}.{node.attr}")
            elif node.attr in PRIVATE_NAMES:
                hit(node, f"{owner}.{node.attr}")
            elif isinstance(node.ctx, (ast.Store, ast.Del)) and owner in patched:
                hit(node, f"{owner}.{node.attr} patched")
            elif node.attr in MUTATORS and _is_sys_modules(node.value):
                hit(node, f"sys.modules.{node.attr}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and _is_sys_modules(node.value):
            hit(node, "sys.modules[...] edited")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            name = node.args[1] if len(node.args) > 1 else None
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and isinstance(name, ast.Constant) \
                    and name.value in PRIVATE_NAMES:
                hit(node, f"{node.func.id}(..., {name.value!r})")
            if node.func.id in ("setattr", "delattr") and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in patched:
                hit(node, f"{node.func.id}({node.args[0].id}, ...) patched")
    return found


def scan(path: Path) -> list[str]:
    return private_accesses(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def test_no_module_but_the_two_internals_reaches_past_a_librarys_public_names():
    modules = [p for p in PACKAGE.rglob("*.py") if p not in INTERNALS]
    assert [hit for path in modules for hit in scan(path)] == []
    for path in INTERNALS:
        assert scan(path), path  # the scan sees what is there


@pytest.mark.parametrize("source", [
    "def f(llm):\n    return llm.llm_engine.step()\n",
    "def f(llm):\n    llm.llm_engine.engine_core.shutdown()\n",
    "def f(trainer):\n    return trainer.vllm_generation\n",
    "def f(g):\n    return getattr(g, 'vllm_client', None)\n",
    "def f(g):\n    return g._iter_named_params()\n",
    "import sys\nsys.modules['x'] = object()\n",
    "import sys\nhidden = sys.modules.pop('llvmlite.binding.ffi')\n",
    "import sys\ndel sys.modules['x']\n",
    "from vllm.lora.punica_wrapper import punica_cpu\npunica_cpu.bgmv_shrink = len\n",
    "from vllm.lora.punica_wrapper import punica_cpu\nsetattr(punica_cpu, 'bgmv_shrink', len)\n",
    "import trl.trainer.utils as u\nu.x = 1\n",
])
def test_the_scan_finds_each_kind_of_private_access(source):
    assert private_accesses(source)


def test_the_scan_leaves_public_use_alone():
    source = ("import sys\nfrom vllm import SamplingParams\n\nclass A:\n    def f(self, llm):\n"
              "        self._x = sys.modules.get('vllm')\n        return llm.generate([], SamplingParams())\n")
    assert private_accesses(source) == []


PLUGIN_CHECK = ("from vllm.plugins import load_general_plugins; load_general_plugins(); "
                "from vllm.lora.punica_wrapper import punica_cpu; from maps_train.platform import vllm_on_cpu; "
                "print(vllm_on_cpu(), punica_cpu.bgmv_shrink.__module__, punica_cpu.PunicaWrapperCPU.add_lora_linear"
                ".__module__)")


def _plugin_check(prelude: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "MAPS_TRAIN_VLLM_CPU_LORA"}  # not a maps-train process
    out = subprocess.run([sys.executable, "-c", prelude + PLUGIN_CHECK], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-3:]


def test_the_cpu_lora_plugin_patches_only_maps_trains_own_vllm_processes():
    """A plain vLLM process of the environment loads maps-train's plugin (it is an entry point) and keeps vLLM's
    own CPU LoRA ops; one whose environment maps-train set (`apply_runtime_defaults`, as every entry point and
    `maps-train serve`'s server get) has the grouped ones, on vLLM-CPU."""
    vllms = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.punica_wrapper.punica_cpu")
    on_cpu, op, method = _plugin_check("")
    assert (op, method) == vllms
    on_cpu, op, method = _plugin_check("from maps_train.platform import apply_runtime_defaults; "
                                       "apply_runtime_defaults(); ")
    ours = "maps_train.llm.vllm_cpu_lora"
    assert (op, method) == ((ours, ours) if on_cpu == "True" else vllms)


def test_pyproject_bounds_trl_to_the_versions_internals_was_written_against():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    trl = next(d for d in dependencies if re.match(r"trl\b", d))
    assert trl == f"trl>={internals.TESTED_TRL[0]},<{internals.TESTED_TRL[1]}"
    assert internals.check_trl_version() is True  # the installed TRL is inside them
