"""The `accelerate launch` command lines behind `maps-train train`: one launch per adapter, in sequence.

Why one launch per adapter (and not `--role all` inside one launch): each adapter starts from a fresh process, so
the previous model, optimizer and CUDA/DeepSpeed state are gone for certain; a crash in one adapter leaves the
finished ones on disk, and a rerun skips them (an adapter is finished when its train_summary.json exists).
`train.one_launch: true` trades that isolation for time where launches dominate (small models on CPU: the demo):
every adapter still to train goes through one launch (`--role all`), which skips the finished ones the same way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from maps_train.config import redact_secrets
from maps_train.errors import MapsTrainError
from maps_train.platform import free_port


def accelerate_args(
    accelerate_config: str | None, num_processes: int | None, bf16: bool, port: int | None = None
) -> list[str]:
    """Launcher flags: the config file when given (with `num_processes` overriding its count when set);
    otherwise flags that work on GPU and on CPU alike.

    Without a GPU, `--multi_gpu` is what starts several ranks (they then join a gloo group because the entry
    point asks accelerate for the CPU); a MULTI_CPU config would quietly start one process.
    """
    from maps_train.train.sft import on_cpu

    args = ["--main_process_port", str(port or free_port())]
    if accelerate_config:
        if not Path(accelerate_config).is_file():
            raise MapsTrainError(f"{accelerate_config}: no such accelerate config (see recipes/accelerate/)")
        count = ["--num_processes", str(num_processes)] if num_processes else []
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
    # With a config file its process count holds unless --num-processes says otherwise.
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
