"""The `accelerate launch` command lines behind `maps-train train`: one launch per adapter, in sequence.

Why one launch per adapter (and not `--role all` inside one launch): each adapter starts from a fresh process, so
the previous model, optimizer and CUDA/DeepSpeed state are gone for certain; a crash in one adapter leaves the
finished ones on disk, and a rerun skips them (an adapter is finished when its train_summary.json exists).
`train.one_launch: true` trades that isolation for time where launches dominate (small models on CPU: the demo):
every adapter still to train goes through one launch (`--role all`), which skips the finished ones the same way.

Rank count: `--num-processes` when given; else the accelerate config's `num_processes` when it sets one; else one
rank per visible GPU. The GPU configs (recipes/accelerate/{ddp,zero2,zero3}.yaml) set none on purpose: accelerate
places rank r on GPU r % device_count, so a fixed 8 would stack all eight ranks on GPU 0 of a one-GPU node.

Several machines (`Machines`): each runs the same `maps-train train` with its own `--machine-rank`; the machine
count, the main machine's address and its port come from the options or from the accelerate config, and are never
replaced by a port picked here (each machine would pick its own and they would never meet). `--num-processes` and
the visible-GPU count are per machine; accelerate is given their total (its `--num_processes` counts every rank of
every machine). Only machine rank 0 writes the adapters.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from maps_train.config.redaction import redact_secrets
from maps_train.errors import MapsTrainError
from maps_train.library_options import SFTOptions
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


@dataclass(frozen=True)
class Machines:
    """This machine's place in a job over several (`maps-train train --num-machines ...`); a field left None is
    taken from the accelerate config, where one is given, else means one machine."""

    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet, as the options and the config together say, and the flags that say it to accelerate."""

    machines: int
    rank: int  # this machine's
    flags: list[str]


def _config_values(accelerate_config: str | None) -> dict:
    if not accelerate_config:
        return {}
    from maps_train.config.yaml_io import read_yaml

    try:
        return read_yaml(accelerate_config) or {}
    except MapsTrainError:  # accelerate's own loader names the file's problem (`config_process_count`)
        return {}


def rendezvous(accelerate_config: str | None, machines: Machines) -> Rendezvous:
    """The machine count and rank, and the flags for the main process's address and port: the options' values
    are passed, the config's hold as written; one machine with neither gets a free local port (concurrent launches
    must not collide); several machines must name the main machine's address and port (options or config)."""
    config = _config_values(accelerate_config)
    count = machines.num_machines or int(config.get("num_machines") or 1)
    rank = machines.machine_rank if machines.machine_rank is not None else int(config.get("machine_rank") or 0)
    if count < 1 or not 0 <= rank < count:
        raise MapsTrainError(f"train: machine rank {rank} is outside 0..{count - 1} ({count} machines)")
    flags: list[str] = []
    if machines.num_machines is not None or not accelerate_config:
        flags += ["--num_machines", str(count)]
    if count > 1:
        ip = machines.main_process_ip or config.get("main_process_ip")
        port = machines.main_process_port or config.get("main_process_port")
        if not ip or not port:
            raise MapsTrainError(f"train: {count} machines need the main machine's address and port: pass "
                                 f"--main-process-ip and --main-process-port (the same on every machine) or set "
                                 f"main_process_ip and main_process_port in the accelerate config")
        if machines.machine_rank is not None or not accelerate_config:
            flags += ["--machine_rank", str(rank)]
        if machines.main_process_ip or not accelerate_config:
            flags += ["--main_process_ip", str(ip)]
        if machines.main_process_port or not accelerate_config:
            flags += ["--main_process_port", str(port)]
    elif machines.main_process_port:
        flags += ["--main_process_port", str(machines.main_process_port)]
    elif not config.get("main_process_port"):
        flags += ["--main_process_port", str(free_port())]
    return Rendezvous(count, rank, flags)


def config_rank_count(accelerate_config: str, num_processes: int | None) -> int | None:
    """The `--num_processes` to pass with a config file: `num_processes` when set; None where the file sets its
    own count (it holds); else one rank per visible GPU (at least one)."""
    if num_processes:
        return num_processes
    if config_process_count(accelerate_config) is not None:
        return None
    return max(visible_gpu_count(), 1)


def accelerate_args(
    accelerate_config: str | None, num_processes: int | None, bf16: bool, port: int | None = None,
    machines: Machines = Machines(),
) -> list[str]:
    """Launcher flags: the config file when given, with its rank count (`config_rank_count`, per machine, times
    the machines); otherwise flags that work on GPU and on CPU alike. `port`: the main process's port (as
    `machines.main_process_port`).

    Without a GPU, `--multi_gpu` is what starts several ranks (they then join a gloo group because the entry
    point asks accelerate for the CPU); a MULTI_CPU config would quietly start one process.
    """
    from maps_train.train.sft import on_cpu

    if accelerate_config and not Path(accelerate_config).is_file():
        raise MapsTrainError(f"{accelerate_config}: no such accelerate config (see recipes/accelerate/)")
    if port and not machines.main_process_port:
        machines = Machines(machines.num_machines, machines.machine_rank, machines.main_process_ip, port)
    ranks = config_rank_count(accelerate_config, num_processes) if accelerate_config else None  # checks the file
    meeting = rendezvous(accelerate_config, machines)
    if accelerate_config:
        count = ["--num_processes", str(ranks * meeting.machines)] if ranks else []
        return ["--config_file", accelerate_config, *count, *meeting.flags]
    total = (num_processes or 1) * meeting.machines
    mixed = "bf16" if bf16 and not on_cpu() else "no"
    args = [*meeting.flags, "--num_processes", str(total), "--mixed_precision", mixed, "--dynamo_backend", "no"]
    if total > 1:
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
    machines: Machines = Machines(),
) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch"]
    command += accelerate_args(accelerate_config, num_processes, bf16, port, machines)
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
    machines: Machines = Machines(),
) -> list[Path]:
    """Train the recipe's adapters (or one), each in its own `accelerate launch`; returns the adapter folders.
    On a machine other than the main one (machine rank > 0) nothing is written here: the adapters are the main
    machine's, so a launch is not checked for one (every machine must see the same finished adapters to skip the
    same ones: keep train.output_dir on a shared file system, or pass the same --role everywhere)."""
    from maps_train.library_options import check_library_sections
    from maps_train.recipe import adapter_names, load_recipe
    from maps_train.train.data import source_adapters
    from maps_train.train.sft import adapter_output_dir, build_lora_config, is_trained

    recipe = load_recipe(recipe_path, overrides)
    check_library_sections(recipe, "train")  # train.sft, train.lora by TRL and PEFT, before any launch
    adapters = adapter_names(recipe) if role == "all" else [role]
    for adapter in adapters:
        source_adapters(recipe, adapter)  # fail on an unknown role before any launch
    build_lora_config(recipe.train)  # and on a LoRA vLLM could not serve
    config = accelerate_config or recipe.train.accelerate_config
    # With a config file its process count (or the visible GPU count) holds unless --num-processes says otherwise.
    processes = num_processes or (None if config else recipe.train.num_processes)
    folders = [adapter_output_dir(recipe, adapter) for adapter in adapters]
    main_machine = rendezvous(config, machines).rank == 0
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
            recipe_path, name, list(overrides), config, processes, bool(SFTOptions.of(recipe.train.sft).bf16), overwrite,
            machines=machines,
        )
        echo(f"{'+'.join(covered)}: {' '.join(redact_secrets(command))}")  # overrides may set backend.api_key
        returncode = subprocess.call(command)
        if returncode != 0:
            raise MapsTrainError(f"{name}: accelerate launch exited with {returncode} (command above)")
        for adapter in covered if main_machine else ():
            if not is_trained(recipe, adapter):
                raise MapsTrainError(f"{adapter_output_dir(recipe, adapter)}: the launch ended without a trained adapter")
    return folders
