"""From a recipe's `train` section to TRL/PEFT objects, and an adapter folder vLLM can serve.

`train.sft` and `train.lora` are handed to `trl.SFTConfig` and `peft.LoraConfig` as they are (the recipe loader has
already checked their keys against those classes); only what maps-train must decide is set here.

Kept apart from the entry point so tests and benchmarks build exactly the configs the launcher uses.

The folders training writes (`<train.output_dir>/<adapter>/` and `<train.output_dir>/_trainer/<adapter>/`) carry a
marker file (`OUTPUT_MARKER`) from the moment they are created, and `--overwrite` removes a folder only when it
holds that marker and lies where this recipe's training writes: a wrong recipe line or a symbolic link can never
make it delete anything else.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maps_train.adapters.set import SFT_SUMMARY_FILE, AdapterSet
from maps_train.config.names import check_plain_name
from maps_train.errors import ConfigError, MapsTrainError
from maps_train.library_options import SFTOptions
from maps_train.platform import cpu_multiplies_bf16
from maps_train.recipe import TRAINER_SUBDIR
from maps_train.tracking import artifact_name, wandb_environment
from maps_train.train.adapter_check import SUPPORTED_MODULES, TOKENIZER_FILES, config_problems, require_valid_adapter
from maps_train.train.markers import OUTPUT_MARKER, SFT_WRITER, mark, marker_writer

SUMMARY_FILE = SFT_SUMMARY_FILE  # written last: its presence marks a finished adapter

logger = logging.getLogger(__name__)


@dataclass
class Precision:
    dtype: str  # the weights' dtype at load time
    bf16: bool  # mixed precision in the trainer


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def distributed_state():
    """accelerate's process state, initialised the way the trainer will initialise it.

    On a machine without CUDA the state must be asked for with `cpu=True`: only then do the ranks that
    `accelerate launch --multi_gpu` started join one gloo group (MULTI_CPU). Without it every rank quietly trains
    alone on the whole set (world size 1, each writing the same adapter).
    """
    from accelerate import PartialState

    restore_to_indexed_cpu()
    return PartialState(cpu=on_cpu())


def _indexed_cpu_storage(storage, location: str):
    return storage if location.startswith("cpu:") else None


@functools.cache
def restore_to_indexed_cpu() -> None:
    """Let `torch.load` restore to `cpu:<n>`. accelerate names a CPU rank's device `cpu:0` when ranks join a gloo
    group, and the Trainer resumes a multi-rank run's optimizer state with that device as `map_location`; torch
    restores only to `cpu` and fails the resume. Registered once per process, through torch's own package registry."""
    from torch import serialization

    serialization.register_package(30, lambda obj: None, _indexed_cpu_storage)


def choose_precision(bf16: bool | None, dtype: str = "auto", section: str = "train.sft") -> Precision:
    """GPU: bf16 when `<section>.bf16`. CPU: float32 weights; bf16 autocast only when it asks and the CPU has bf16
    instructions (`cpu_multiplies_bf16`), else float32 throughout (said once in the log). `dtype`: the weights'
    dtype at load time (`train.dtype`; auto: bfloat16 with bf16 on GPU, else float32)."""
    bf16 = bool(bf16)
    if on_cpu():
        if bf16 and not cpu_multiplies_bf16():
            logger.warning("%s.bf16: this CPU has no bf16 instructions (AVX512-BF16, AMX); training in float32",
                           section)
            bf16 = False
        return Precision(dtype="float32" if dtype == "auto" else dtype, bf16=bf16)
    if dtype != "auto":
        return Precision(dtype=dtype, bf16=bf16)
    return Precision(dtype="bfloat16" if bf16 else "float32", bf16=bf16)


def adapter_output_dir(recipe, adapter: str) -> Path:
    # The recipe's adapter names were checked when it loaded; `--role` and recipes built in code were not.
    return Path(recipe.train.output_dir) / check_plain_name(adapter, "adapter")


def adapter_artifact(recipe_name: str, adapter: str) -> str:
    """The W&B artifact name of one trained adapter (`adapter-<recipe name>-<adapter>`)."""
    return artifact_name("adapter", f"{recipe_name}-{adapter}")


def adapter_artifacts(recipe, adapters: AdapterSet) -> list[tuple[str, Path]]:
    """(artifact name, folder) of every adapter of `adapters` with weights: what an eval run of the student links
    as its inputs (`tracker.use_artifact(name, "adapter", folder)`); not one that learned nothing (`train.unlearned`:
    no weights, no artifact)."""
    return [(adapter_artifact(recipe.name, name), folder) for name, folder in adapters.served().items()]


def write_adapter_set(recipe) -> Path:
    """The manifest of the adapters training wrote (`<train.output_dir>/adapters.json`), from their own records:
    per adapter its folder or none (learned nothing), its roles and the ones it learned, the sha256 of its weights;
    the base model and the lineage (traces, SFT set). Written by the main rank after each adapter."""
    from maps_train.recipe import adapter_of_role, sft_traces_dir, train_sft_dir

    lineage = {"student": recipe.train.student, "traces": str(sft_traces_dir(recipe)),
               "sft_set": str(train_sft_dir(recipe)), "parent": None}
    return AdapterSet.from_records(Path(recipe.train.output_dir), adapter_of_role(recipe),
                                   recorded_base_model(recipe.train.student), lineage).write()


def trainer_dir(recipe, adapter: str) -> Path:
    return Path(recipe.train.output_dir) / TRAINER_SUBDIR / check_plain_name(adapter, "adapter")


def sole_trainer(recipe, adapter: str, state):
    """The main rank's hold on training `adapter` (`<train.output_dir>/_trainer/.lock-<adapter>`, beside the folder
    that `--overwrite` removes, never inside it): a second `train` of the same adapter is refused in one line naming
    the first, instead of resuming from checkpoints still being written or losing them to the first's rotation.
    Other ranks run under their main rank's hold."""
    from contextlib import nullcontext

    from maps_train.runlock import sole_writer

    if not state.is_main_process:
        return nullcontext()
    name = check_plain_name(adapter, "adapter")
    return sole_writer(Path(recipe.train.output_dir) / TRAINER_SUBDIR, f"maps-train train ({name})",
                       name=f".lock-{name}")


def is_trained(recipe, adapter: str) -> bool:
    return (adapter_output_dir(recipe, adapter) / SUMMARY_FILE).is_file()


def lora_target_modules(targets: Any) -> Any:
    """`all-linear` means every attention and MLP projection (PEFT's all-linear leaves lm_head out too, but may take
    other linear layers vLLM serves no LoRA on); anything else goes to PEFT as written (and is checked after)."""
    return list(SUPPORTED_MODULES) if targets == "all-linear" else targets


def build_lora_config(train):
    """peft.LoraConfig from `train.lora`, refused here when vLLM could not serve the adapter it would train (the rules
    `adapter_check` applies to saved adapters: rank, target modules, DoRA, modules_to_save, ...)."""
    from peft import LoraConfig

    options = {**train.lora, "target_modules": lora_target_modules(train.lora.get("target_modules"))}
    try:
        config = LoraConfig(**options)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"train.lora: peft.LoraConfig refuses it: {' '.join(str(err).split())}") from None
    problems = config_problems(config.to_dict())
    if problems:
        raise MapsTrainError(f"train.lora: vLLM could not serve this adapter: {'; '.join(problems)}")
    return config


def refuse_hub_token(options: dict[str, Any], section: str) -> None:
    """A hub token in a recipe would be saved in plain text in every checkpoint (the Trainer pickles its arguments
    into `training_args.bin`): refused in one line that does not repeat it; huggingface_hub reads `HF_TOKEN` or the
    saved login (`hf auth login`) when `push_to_hub` needs one."""
    if options.get("hub_token"):
        raise ConfigError(f"{section}.hub_token: a token in a recipe is saved with every checkpoint's "
                          "training_args.bin; remove it and set HF_TOKEN in the environment (or `hf auth login`)")


def build_sft_config(recipe, adapter: str, precision: Precision, has_eval: bool = False):
    """trl.SFTConfig for one adapter: `train.sft` as written (our defaults under it), plus what maps-train decides:
    where checkpoints go, the machine's precision, W&B from the recipe, no evaluation without an eval split."""
    from trl import SFTConfig

    refuse_hub_token(recipe.train.sft, "train.sft")
    kwargs: dict[str, Any] = dict(recipe.train.sft)
    wandb_on = wandb_environment(recipe.wandb, recipe.name)
    kwargs.setdefault("run_name", f"{recipe.name}-{adapter}")
    kwargs.setdefault("report_to", ["wandb"] if wandb_on else "none")
    options = SFTOptions.of(recipe.train.sft)
    kwargs.setdefault("per_device_eval_batch_size", options.per_device_train_batch_size)
    if options.gradient_checkpointing:
        kwargs.setdefault("gradient_checkpointing_kwargs", {"use_reentrant": False})
    kwargs.update(
        output_dir=str(trainer_dir(recipe, adapter)),
        bf16=precision.bf16,
        use_cpu=on_cpu(),  # see distributed_state(): joins CPU ranks into one gloo group
    )
    if on_cpu():
        kwargs["fp16"] = False
    if not has_eval:
        kwargs["eval_strategy"] = "no"  # the trainer refuses an eval strategy without an eval set
    try:
        return SFTConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise MapsTrainError(f"train.sft: trl.SFTConfig refuses it: {' '.join(str(err).split())}") from None


def load_student(train, precision: Precision):
    """The base model `train.student` (never resized: the adapter must fit the base vLLM serves)."""
    import torch
    from transformers import AutoModelForCausalLM

    from maps_train.models import resolve_model

    kwargs: dict[str, Any] = {"dtype": getattr(torch, precision.dtype)}
    if train.attn_implementation:
        kwargs["attn_implementation"] = train.attn_implementation
    return AutoModelForCausalLM.from_pretrained(resolve_model(train.student), **kwargs)


def load_tokenizer(student: str):
    """The student's tokenizer (`train.student`); one without a chat template is refused."""
    from transformers import AutoTokenizer

    from maps_train.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(student))
    if not tokenizer.chat_template:
        raise MapsTrainError(f"train.student: {student} has no chat template (use an instruct model)")
    return tokenizer


def recorded_base_model(student: str) -> str:
    """What adapter_config.json names as base: the hub id when the student is one, else the local folder."""
    from maps_train.models import resolve_model

    resolved = resolve_model(student)
    is_hub_id = not student.startswith("builtin:") and not Path(student).expanduser().exists()
    return student if is_hub_id else str(Path(resolved).resolve())


def save_adapter(trainer, folder: Path, base_model: str) -> None:
    """The trained adapter alone, checked (rank 0) the way vLLM will load it: its weights and its config, which
    names `base_model` (`recorded_base_model`) as its base; no tokenizer (vLLM deprecates per-LoRA tokenizers), no
    trainer args, and none of the other adapters PEFT saves in subfolders beside it (GRPO's frozen "ref" copy of
    its starting adapter)."""
    configs = getattr(trainer.accelerator.unwrap_model(trainer.model), "peft_config", {})
    for config in configs.values():
        config.base_model_name_or_path = base_model  # PEFT writes it, with inference_mode true, when it saves
    trainer.save_model(str(folder))  # gathers ZeRO-3 shards where needed; every rank must call it
    if not trainer.accelerator.is_main_process:
        return
    for name in (*TOKENIZER_FILES, "training_args.bin"):
        (folder / name).unlink(missing_ok=True)
    for other in configs:
        if other != "default":
            shutil.rmtree(folder / other, ignore_errors=True)
    require_valid_adapter(folder)


def last_complete_checkpoint(folder: Path) -> str | None:
    """The newest `checkpoint-<step>` under `folder` that was saved whole and whose state reads back, or None.

    transformers' `get_last_checkpoint` takes the highest step without looking inside, so a kill in the middle of a
    save (a folder holding only a rank's `rng_state_1.pth`) would be resumed from and fail. The Trainer writes
    `trainer_state.json` last, so a checkpoint that has it is complete; one whose `trainer_state.json` is torn or
    unreadable (a full disk, a cut copy) is skipped with a warning and the next older one is taken, instead of a
    traceback on every rerun."""
    if not folder.is_dir():
        return None
    steps = [(int(path.name.removeprefix("checkpoint-")), path) for path in folder.iterdir()
             if path.is_dir() and path.name.removeprefix("checkpoint-").isdigit()]
    for _, path in sorted(steps, reverse=True):
        state = path / "trainer_state.json"
        if not state.is_file():
            continue  # cut before its state was written
        problem = checkpoint_state_problem(state) or torn_rng_state(path)
        if problem is None:
            return str(path)
        logger.warning("%s: %s; skipped, resuming from an older checkpoint if there is one", state, problem)
    return None


def torn_rng_state(checkpoint: Path) -> str | None:
    """Which RNG state of `checkpoint` is torn, or None. Each rank writes its own `rng_state_<rank>.pth` with no
    barrier before rank 0 writes `trainer_state.json`, so a kill can leave another rank's file cut short; the Trainer
    tolerates a missing one but fails on a torn one. `torch.save` writes a zip archive, whose directory comes last."""
    import zipfile

    for rng_file in sorted(checkpoint.glob("rng_state*.pth")):
        try:
            with zipfile.ZipFile(rng_file) as archive:
                bad = archive.testzip()
        except (OSError, zipfile.BadZipFile) as err:
            return f"{rng_file.name} is torn ({err})"
        if bad is not None:
            return f"{rng_file.name} is torn (bad member {bad})"
    return None


MAX_TRAINER_STATE_BYTES = 64 * 1024 * 1024  # a state's log history, one entry per logged step


def checkpoint_state_problem(state: Path) -> str | None:
    """Why a checkpoint's trainer_state.json cannot be resumed from (None when it can): it must be a regular file
    of at most MAX_TRAINER_STATE_BYTES holding a JSON object with an integer `global_step`."""
    from maps_train import safejson

    try:
        if not state.is_file() or state.stat().st_size > MAX_TRAINER_STATE_BYTES:
            return f"not a regular file of at most {MAX_TRAINER_STATE_BYTES:,} bytes"
        with state.open("rb") as handle:
            data = handle.read(MAX_TRAINER_STATE_BYTES + 1)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    try:
        parsed = safejson.loads(data)
    except safejson.JSONLimitError as err:
        return f"torn or not JSON ({err})"
    step = parsed.get("global_step") if isinstance(parsed, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return "no integer global_step"
    return None


def _output_dirs(recipe, adapter: str) -> list[tuple[Path, Path, bool]]:
    """(folder, the folder it must lie in, whether it holds trainer state) of everything training writes for
    `adapter`: the adapter itself and its checkpoints."""
    root = Path(recipe.train.output_dir)
    return [(adapter_output_dir(recipe, adapter), root, False),
            (trainer_dir(recipe, adapter), root / TRAINER_SUBDIR, True)]


def _written_before_markers(folder: Path, adapter: str, trainer_state: bool) -> bool:
    """A folder of ours from before the marker existed: trainer state (nothing but TRL's `checkpoint-<step>`
    folders), or a finished adapter (our train_summary.json naming this adapter, beside its adapter_config.json)."""
    if trainer_state:
        entries = list(folder.iterdir())
        return bool(entries) and all(e.is_dir() and e.name.removeprefix("checkpoint-").isdigit() for e in entries)
    try:
        summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("adapter") == adapter and (folder / "adapter_config.json").is_file()


def _removal_problem(folder: Path, parent: Path, adapter: str, trainer_state: bool) -> str | None:
    """Why `--overwrite` must not remove `folder` (None when it may): it is a link, it resolves outside `parent`
    (under the output root), or nothing says maps-train wrote it."""
    if folder.is_symlink():
        return "is a symbolic link"
    if folder.resolve().parent != parent.resolve():
        return f"resolves to {folder.resolve()}, outside {parent.resolve()}"
    if not folder.is_dir():
        return "is not a folder"
    if (folder / OUTPUT_MARKER).is_file() or _written_before_markers(folder, adapter, trainer_state):
        return None
    return f"has no {OUTPUT_MARKER}: not a folder maps-train training wrote"


def check_clearable(recipe, adapter: str) -> None:
    """Raise (one line, nothing removed) unless `--overwrite` may remove every folder training wrote for `adapter`."""
    for folder, parent, trainer_state in _output_dirs(recipe, adapter):
        if not folder.exists() and not folder.is_symlink():
            continue
        problem = _removal_problem(folder, parent, adapter, trainer_state)
        if problem:
            raise MapsTrainError(f"{folder}: --overwrite refused: it {problem} (remove it yourself if it is to go)")


def clear_adapter(recipe, adapter: str) -> None:
    """Forget a finished adapter (for --overwrite): its folder and its trainer state, after `check_clearable`
    found both to be ours (so both go or neither does)."""
    check_clearable(recipe, adapter)
    for folder, _, _ in _output_dirs(recipe, adapter):
        if folder.exists():
            shutil.rmtree(folder)


def check_writable(recipe, adapter: str) -> None:
    """Raise (one line) unless training may write into every folder it writes for `adapter`: absent, marked, ours
    from an earlier version, or an empty folder (not a link). Read-only, so every rank can run it."""
    for folder, parent, trainer_state in _output_dirs(recipe, adapter):
        writer = marker_writer(folder)
        if writer not in (None, SFT_WRITER, "unknown"):  # RL's checkpoints: resuming from them would train from RL's policy
            raise MapsTrainError(f"{folder}: training would write into it, but it holds another stage's output "
                                 f"({OUTPUT_MARKER} says {writer!r}); set train.output_dir to a folder of its own")
        if writer == SFT_WRITER:
            continue
        if folder.exists() or folder.is_symlink():
            problem = _removal_problem(folder, parent, adapter, trainer_state)
            empty = folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
            if problem and not empty:
                raise MapsTrainError(f"{folder}: training would write into it, but it {problem}")


def mark_output_dirs(recipe, adapter: str) -> None:
    """Create the folders training writes, each with the marker that makes it removable by `--overwrite`.

    A folder that is already there is marked only when `check_writable` allows it, so training never writes into
    (nor a later `--overwrite` removes) a folder of someone else's files."""
    check_writable(recipe, adapter)
    for folder, _, _ in _output_dirs(recipe, adapter):
        mark(folder, SFT_WRITER, adapter=adapter)


def prepare_output_dirs(recipe, adapter: str, overwrite: bool, state) -> None:
    """Before training `adapter`: every rank checks that what is there may go (`overwrite`) or be written into (so
    all ranks fail alike instead of waiting at a barrier for a main rank that failed), then the main rank removes
    it (`overwrite`) and creates the folders with their markers."""
    from maps_train.train.data import source_adapters

    source_adapters(recipe, adapter)  # an adapter of this recipe (or 'shared'): before anything is removed
    if overwrite:
        check_clearable(recipe, adapter)
        state.wait_for_everyone()
    else:
        check_writable(recipe, adapter)
    if state.is_main_process:
        if overwrite:
            clear_adapter(recipe, adapter)
        mark_output_dirs(recipe, adapter)
