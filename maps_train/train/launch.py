"""The `accelerate launch` command lines behind `maps-train train`: one launch per adapter, in sequence.

Why one launch per adapter (and not `--role all` inside one launch): each adapter starts from a fresh process, so
the previous model, optimizer and CUDA/DeepSpeed state are gone for certain; a crash in one adapter leaves the
finished ones on disk, and a rerun skips them (an adapter is finished when its train_summary.json exists).
`train.one_launch: true` trades that isolation for time where launches dominate (small models on CPU: the demo):
every adapter still to train goes through one launch (`--role all`), which skips the finished ones the same way.

Rank count: `--num-processes` when given; else the accelerate config's `num_processes` when it sets one; else one
rank per visible GPU. The GPU configs (recipes/accelerate/{ddp,zero2,zero3}.yaml) set none on purpose: accelerate
places rank r on GPU r % device_count, so a fixed 8 would stack all eight ranks on GPU 0 of a one-GPU node.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from maps_train.config import redact_secrets
from maps_train.errors import MapsTrainError
from maps_train.platform import free_port


def visible_gpu_count() -> int:
    """GPUs this process may use (after CUDA_VISIBLE_DEVICES); 0 without CUDA. Read as accelerate reads it when it
    picks a rank count itself."""
    import torch

    return torch.cuda.device_count()


def config_process_count(accelerate_config: str) -> int | None:
    """The `num_processes` an accelerate config file sets, or None where it leaves the count to the launcher
    (accelerate's loader marks an absent count as -1)."""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        count = load_config_from_file(accelerate_config).num_processes
    except (ValueError, AttributeError, OSError, yaml.YAMLError) as err:  # what accelerate's loader raises on a bad file
        reason = " ".join(str(err).split())  # YAML errors span lines; the error stays one
        raise MapsTrainError(f"{accelerate_config}: not a usable accelerate config ({reason})") from None
    if isinstance(count, bool) or not isinstance(count, int):
        raise MapsTrainError(f"{accelerate_config}: num_processes must be a whole number, got {count!r}")
    return None if count < 0 else count


def config_rank_count(accelerate_config: str, num_processes: int | None) -> int | None:
    """The `--num_processes` to pass with a config file: `num_processes` when set; None where the file sets its
    own count (it holds); else one rank per visible GPU (at least one)."""
    if num_processes:
        return num_processes
    if config_process_count(accelerate_config) is not None:
        return None
    return max(visible_gpu_count(), 1)


def accelerate_args(
    accelerate_config: str | None, num_processes: int | None, bf16: bool, port: int | None = None
) -> list[str]:
    """Launcher flags: the config file when given, with its rank count (`config_rank_count`); otherwise flags
    that work on GPU and on CPU alike.

    Without a GPU, `--multi_gpu` is what starts several ranks (they then join a gloo group because the entry
    point asks accelerate for the CPU); a MULTI_CPU config would quietly start one process.
    """
    from maps_train.train.sft import on_cpu

    args = ["--main_process_port", str(port or free_port())]
    if accelerate_config:
        if not Path(accelerate_config).is_file():
            raise MapsTrainError(f"{accelerate_config}: no such accelerate config (see recipes/accelerate/)")
        ranks = config_rank_count(accelerate_config, num_processes)
        count = ["--num_processes", str(ranks)] if ranks else []
        return ["--config_file", accelerate_config, *count, *args]
    num_processes = num_processes or 1
    mixed = "bf16" if bf16 and not on_cpu() else "no"
    args += ["--num_processes", str(num_processes), "--num_machines", "1", "--mixed_precision", mixed]
    args += ["--dynamo_backend", "no"]
    if num_processes > 1:
        args.append("--multi_gpu")
    return args


def launch_command(
    recipe_path: str,
    adapter: str,
    overrides: list[str] = (),
    accelerate_config: str | None = None,
    num_processes: int | None = None,
    bf16: bool = False,
    overwrite: bool = False,
    port: int | None = None,
) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch"]
    command += accelerate_args(accelerate_config, num_processes, bf16, port)
    command += ["-m", "maps_train.train", "--config", recipe_path, "--role", adapter]
    if overwrite:
        command.append("--overwrite")
    return command + list(overrides)


def train_all(
    recipe_path: str,
    role: str = "all",
    overrides: list[str] = (),
    accelerate_config: str | None = None,
    num_processes: int | None = None,
    overwrite: bool = False,
    echo=print,
) -> list[Path]:
    """Train the recipe's adapters (or one), each in its own `accelerate launch`; returns the adapter folders."""
    from maps_train.recipe import adapter_names, load_recipe
    from maps_train.train.data import source_adapters
    from maps_train.train.sft import adapter_output_dir, build_lora_config, is_trained

    recipe = load_recipe(recipe_path, overrides)
    adapters = adapter_names(recipe) if role == "all" else [role]
    for adapter in adapters:
        source_adapters(recipe, adapter)  # fail on an unknown role before any launch
    build_lora_config(recipe.train)  # and on a LoRA vLLM could not serve
    config = accelerate_config or recipe.train.accelerate_config
    # With a config file its process count (or the visible GPU count) holds unless --num-processes says otherwise.
    processes = num_processes or (None if config else recipe.train.num_processes)
    folders = [adapter_output_dir(recipe, adapter) for adapter in adapters]
    todo = []
    for adapter, folder in zip(adapters, folders):
        if is_trained(recipe, adapter) and not overwrite:
            echo(f"{adapter}: already trained in {folder} (--overwrite retrains it)")
        else:
            todo.append(adapter)
    launches = [("all", todo)] if recipe.train.one_launch and role == "all" and len(todo) > 1 else [
        (adapter, [adapter]) for adapter in todo
    ]
    for name, covered in launches:
        command = launch_command(
            recipe_path, name, list(overrides), config, processes, bool(recipe.train.sft.get("bf16")), overwrite
        )
        echo(f"{'+'.join(covered)}: {' '.join(redact_secrets(command))}")  # overrides may set backend.api_key
        returncode = subprocess.call(command)
        if returncode != 0:
            raise MapsTrainError(f"{name}: accelerate launch exited with {returncode} (command above)")
        for adapter in covered:
            if not is_trained(recipe, adapter):
                raise MapsTrainError(f"{adapter_output_dir(recipe, adapter)}: the launch ended without a trained adapter")
    return folders
