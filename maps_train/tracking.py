"""Experiment tracking, the one W&B path of every stage (traces, training, eval, analysis): a thin, switchable
layer, W&B when enabled and a no-op with the same methods otherwise.

`WandbConfig` is the `wandb:` section of recipes and suites. `WANDB_MODE` in the environment (e.g. `offline`, set
by the tests and the Makefile) wins over the section's `mode`; offline runs land under `<dir>/wandb/offline-run-*`
and can be uploaded later with `wandb sync`. Run configs pass through `redact_secrets` first, and every run is
started with W&B's own recording of the process switched off (`PRIVATE_SETTINGS`: no command line, metadata, code
or git state), so no API key or token reaches W&B. Training logs through the transformers W&B integration, which
reads the same section, and the same private settings, from the environment (`wandb_environment`).

Artifacts link what each stage made to what it read: traces -> SFT sets -> adapters -> eval results
(`log_artifact`, `use_artifact`; names from `artifact_name`). W&B refuses `use_artifact` in offline runs, so there
every input is also recorded (name, type, content digest) in the run config and in the metadata of each artifact
the run logs after it: an offline run folder holds the manifests and the links, and `wandb sync` uploads both.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from maps_train.config.redaction import redact_secrets


@dataclass
class WandbConfig:
    """The recipe's `wandb:` section: whether and where each stage logs its W&B run."""

    enabled: bool = field(default=False, metadata={"help": "Log each stage to Weights & Biases."})
    project: str = field(default="maps-train", metadata={"help": "The W&B project."})
    entity: str | None = field(default=None, metadata={"help": "The W&B entity (team or user); null: W&B's default."})
    group: str | None = field(default=None, metadata={"help": "The runs' group; null: the recipe's (or suite's) name."})
    mode: Literal["online", "offline", "disabled"] = field(default="offline", metadata={
        "help": "W&B's mode (WANDB_MODE in the environment wins)."})
    dir: str | None = field(default=None, metadata={"help": "Where runs are written; null: the stage's output/wandb."})
    tags: list[str] = field(default_factory=list, metadata={"help": "Tags put on every run."})


# What W&B would otherwise record about the process: the command line (`backend.api_key=...` overrides and all)
# with the host, program and Python in the run's metadata (`x_disable_meta`), the program's code, the git state
# (a diff can hold a key) and a Launch job built from them. Off in every run, whoever starts it.
PRIVATE_SETTINGS = {"x_disable_meta": True, "disable_code": True, "save_code": False, "disable_git": True,
                    "disable_job_creation": True}

SKIPPED = ("wandb",)  # run folders that live inside stage outputs are never part of an artifact
ARTIFACT_NAME_LIMIT = 128  # W&B's limit


def effective_mode(config: WandbConfig) -> str:
    return os.environ.get("WANDB_MODE") or config.mode


class Tracker:
    """Tracking switched off: every method accepts the same arguments and does nothing."""

    def __init__(self) -> None:
        self.run_dirs: list[Path] = []

    def start_run(self, name: str, config: dict[str, Any], job_type: str = "eval") -> None:
        pass

    def log_summary(self, metrics: dict[str, Any]) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        pass

    def log_scatter(self, key: str, columns: list[str], rows: list[list[Any]], x: str, y: str, title: str) -> None:
        pass

    def log_image(self, key: str, path: str | Path) -> None:
        pass

    def use_artifact(self, name: str, type: str, path: str | Path, *, reference: bool = False,
                     skip: tuple[str, ...] = SKIPPED) -> None:
        """Record that this run read the artifact `name` made from `path` (its files now, as `log_artifact` adds
        them, so the link is to the exact content read)."""

    def log_artifact(self, name: str, type: str, path: str | Path, *, reference: bool = False,
                     skip: tuple[str, ...] = SKIPPED, metadata: dict[str, Any] | None = None) -> None:
        """Log the file or folder `path` as artifact `name` of `type` (a new version when its content changed).
        `reference`: record each file's path and checksum without uploading it (teacher traces: large, and
        already where every student reads them). Folders named in `skip` (run folders, SFT sets under the
        traces) are left out."""

    def finish_run(self) -> None:
        pass


class WandbTracker(Tracker):
    def __init__(self, config: WandbConfig, group: str, out_dir: Path):
        super().__init__()
        self.config = config
        self.group = config.group or group
        self.dir = Path(config.dir) if config.dir else out_dir / "wandb"
        self.mode = effective_mode(config)
        self.run = None
        self.inputs: list[dict[str, str]] = []  # artifacts this run read (see use_artifact)

    @classmethod
    def attach(cls, run) -> WandbTracker:
        """A tracker over a run someone else started (the transformers integration's, in training)."""
        tracker = cls(WandbConfig(enabled=True), run.group or "", Path(run.dir))
        tracker.run = run
        return tracker

    def start_run(self, name: str, config: dict[str, Any], job_type: str = "eval") -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.config.project,
            entity=self.config.entity,
            group=self.group,
            name=name,
            job_type=job_type,
            tags=self.config.tags or None,
            config=redact_secrets(config),
            dir=str(self.dir),
            mode=self.mode,
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, **PRIVATE_SETTINGS),
        )
        if self.run is not None and getattr(self.run, "dir", None):
            self.run_dirs.append(Path(self.run.dir).parent)

    def log_summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        import wandb

        if self.run is not None:
            self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def log_scatter(self, key: str, columns: list[str], rows: list[list[Any]], x: str, y: str, title: str) -> None:
        """A native W&B scatter over a table, explorable (and re-plottable on any column) in the W&B UI."""
        import wandb

        if self.run is not None:
            table = wandb.Table(columns=columns, data=rows)
            self.run.log({key: wandb.plot.scatter(table, x, y, title=title)})

    def log_image(self, key: str, path: str | Path) -> None:
        import wandb

        if self.run is not None and Path(path).is_file():
            self.run.log({key: wandb.Image(str(path))})

    def use_artifact(self, name: str, type: str, path: str | Path, *, reference: bool = False,
                     skip: tuple[str, ...] = SKIPPED) -> None:
        if self.run is None:
            return
        artifact = _local_artifact(name, type, Path(path), reference, skip)
        self.inputs.append({"name": name, "type": type, "digest": artifact.digest})
        if self.run.offline:  # W&B cannot look artifacts up offline: the link goes into the config instead
            self.run.config.update({"artifact_inputs": self.inputs}, allow_val_change=True)
        else:
            self.run.use_artifact(artifact)  # a draft: logged (or matched by digest) and marked as used

    def log_artifact(self, name: str, type: str, path: str | Path, *, reference: bool = False,
                     skip: tuple[str, ...] = SKIPPED, metadata: dict[str, Any] | None = None) -> None:
        if self.run is None:
            return
        meta = {**(metadata or {}), "source_path": str(path), "inputs": list(self.inputs)}
        self.run.log_artifact(_local_artifact(name, type, Path(path), reference, skip, meta))

    def finish_run(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def active_tracker() -> Tracker:
    """The W&B run already open in this process (the transformers integration's, on the main rank), as a tracker;
    the no-op tracker when there is none. Never imports wandb itself."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    return WandbTracker.attach(run) if run is not None else Tracker()




def artifact_name(kind: str, label: str | Path) -> str:
    """`kind`-`label` in the characters W&B allows; a path label is taken relative to the working directory, so
    the stage that writes a folder and the stages that read it name it alike (`runs/t/traces` ->
    `traces-runs-t-traces-<hash>`). A label whose characters had to be replaced carries 8 hex digits of its own
    hash, so two labels never share a name (`runs/a/b`, `runs/a-b`); a plain name is kept as it is. Too long: the
    end is kept, with a hash of the whole."""
    text = os.path.normpath(label)
    if isinstance(label, Path) and label.is_absolute() and label.is_relative_to(Path.cwd()):
        text = str(label.relative_to(Path.cwd()))
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")
    name = f"{kind}-{clean}"
    if clean != text:  # characters replaced: `runs/a/b` and `runs/a-b` (or `a b`, `a-b`) would meet in one name
        name += "-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    if len(name) <= ARTIFACT_NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{kind}-{digest}-{name[-(ARTIFACT_NAME_LIMIT - len(kind) - 12):].lstrip('-.')}"


def _artifact_files(path: Path, skip: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(name in the artifact, file) for a file, or every file under a folder outside the `skip` folders."""
    if path.is_file():
        return [(path.name, path)]
    files = []
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if file.is_file() and not any(part in skip for part in relative.parts[:-1]):
            files.append((relative.as_posix(), file))
    return files


def _local_artifact(name: str, type: str, path: Path, reference: bool, skip: tuple[str, ...],
                    metadata: dict[str, Any] | None = None):
    import wandb

    artifact = wandb.Artifact(name, type=type, metadata=metadata)
    for entry, file in _artifact_files(path, skip):
        if reference:
            artifact.add_reference(file.resolve().as_uri(), name=entry)  # checksummed, not uploaded
        else:
            artifact.add_file(str(file), name=entry)
    return artifact


def make_tracker(config: WandbConfig, group: str, out_dir: str | Path) -> Tracker:
    if not config.enabled or effective_mode(config) == "disabled":
        return Tracker()
    return WandbTracker(config, group, Path(out_dir))


def wandb_environment(config: WandbConfig, group: str) -> bool:
    """Put the section into the environment, where the transformers W&B integration (training) reads it.

    A WANDB_MODE already in the environment wins, so `WANDB_MODE=offline` keeps any recipe off the network.
    `PRIVATE_SETTINGS` go there too: the integration starts its run without settings of ours.
    Returns whether W&B is on.
    """
    if not config.enabled or effective_mode(config) == "disabled":
        return False
    os.environ.update(private_environment())  # forced: a run that records the command line records its keys
    os.environ.setdefault("WANDB_MODE", config.mode)
    os.environ["WANDB_PROJECT"] = config.project
    os.environ["WANDB_RUN_GROUP"] = config.group or group
    if config.entity:
        os.environ["WANDB_ENTITY"] = config.entity
    if config.dir:
        Path(config.dir).mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_DIR"] = config.dir
    if config.tags:
        os.environ["WANDB_TAGS"] = ",".join(config.tags)
    return True


def private_environment() -> dict[str, str]:
    """`PRIVATE_SETTINGS` as the variables wandb reads settings from (`Settings.update_from_env_vars`: setting `x`
    from `WANDB_X`, a private `x_y` from `WANDB__Y`), for runs that other code starts."""
    return {
        ("WANDB__" + name[2:] if name.startswith("x_") else "WANDB_" + name).upper(): str(value).lower()
        for name, value in PRIVATE_SETTINGS.items()
    }
