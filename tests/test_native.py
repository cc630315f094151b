"""Issue 39's native-library and clean-up items: no import circle inside a package, parameter counts read through
the safetensors library, the LoRA ranks vLLM itself accepts."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "maps_train"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package's modules `path` imports, lazy imports inside functions included (`from a import b` names the
    module `a.b` when b is a module, else `a`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def test_no_package_has_an_import_circle():
    """Modules of one sub-package import each other in one direction only; a circle (even through a lazy import)
    means a shared piece sits in the wrong module. A package's __init__ re-exporting its modules is not a circle."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = graphlib.TopologicalSorter()
    for name, path in paths.items():
        if path.name == "__init__.py":
            continue
        package = name.rpartition(".")[0]
        within = {target for target in imported_modules(path, set(paths)) if target.rpartition(".")[0] == package}
        graph.add(name, *(target for target in within if paths[target].name != "__init__.py"))
    try:
        graph.prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


# ---------------------------------------------------------------- parameter counts from safetensors headers


def test_safetensors_parameters_count_every_tensor_in_every_shard(tmp_path):
    """The count is the sum of every tensor's numel over all shards, metadata ignored (the old hand-parsed
    header gave the same: 4*6 + 6 + 3*5*2 + 0 + 7 = 67)."""
    import numpy as np
    from safetensors.numpy import save_file

    from maps_train.evaluate.cost import safetensors_parameters

    first = {"a.weight": np.zeros((4, 6), np.float32), "a.bias": np.zeros(6, np.float16)}
    second = {"b.weight": np.zeros((3, 5, 2), np.int8), "empty": np.zeros((0, 3), np.float32),
              "scalar_row": np.zeros(7, np.float64)}
    save_file(first, tmp_path / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(second, tmp_path / "model-00002-of-00002.safetensors")
    expected = sum(array.size for array in (*first.values(), *second.values()))
    assert expected == 67
    assert safetensors_parameters(tmp_path) == expected
    assert safetensors_parameters(tmp_path / "nothing-here") is None


def test_an_unreadable_safetensors_file_is_one_line_naming_it(tmp_path):
    import pytest

    from maps_train.errors import MapsTrainError
    from maps_train.evaluate.cost import safetensors_parameters

    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(MapsTrainError, match=r"model\.safetensors: not a readable safetensors file") as err:
        safetensors_parameters(tmp_path)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- LoRA ranks: vLLM's own


def test_lora_ranks_are_the_ones_vllms_own_config_accepts():
    """Every rank vLLM's LoRAConfig validates, and no other (1..1024 tried), is what plans and checks use; the
    fallback for machines without vLLM matches the installed version too."""
    import pydantic
    from vllm.config.lora import LoRAConfig

    from maps_train.train.adapter_check import VLLM_LORA_RANKS, rank_problem, vllm_lora_ranks

    def accepted(rank: int) -> bool:
        try:
            LoRAConfig(max_lora_rank=rank)
        except pydantic.ValidationError:
            return False
        return True

    vllms_own = tuple(rank for rank in range(1, 1025) if accepted(rank))
    assert vllm_lora_ranks() == vllms_own
    assert VLLM_LORA_RANKS == vllms_own
    assert rank_problem(vllms_own[-1]) is None
    assert "exceeds the largest rank vLLM serves" in rank_problem(vllms_own[-1] + 1)
