"""Experiment tracking, the one W&B path of every stage (traces, training, eval, analysis): a thin, switchable
layer, W&B when enabled and a no-op with the same methods otherwise.

`WandbConfig` is the `wandb:` section of recipes and suites. `WANDB_MODE` in the environment (e.g. `offline`, set
by the tests and the Makefile) wins over the section's `mode`; offline runs land under `<dir>/wandb/offline-run-*`
and can be uploaded later with `wandb sync`. Run configs pass through `redact_secrets` first, so no API key or
token reaches W&B. Training logs through the transformers W&B integration, which reads the same section from the
environment (`wandb_environment`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from maps_train.config import redact_secrets


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "maps-train"
    entity: str | None = None
    group: str | None = None  # the recipe's (or suite's) name when null
    mode: Literal["online", "offline", "disabled"] = "offline"
    dir: str | None = None  # the stage's output folder + /wandb when null
    tags: list[str] = field(default_factory=list)


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
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True),
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

    def finish_run(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def make_tracker(config: WandbConfig, group: str, out_dir: str | Path) -> Tracker:
    if not config.enabled or effective_mode(config) == "disabled":
        return Tracker()
    return WandbTracker(config, group, Path(out_dir))


def wandb_environment(config: WandbConfig, group: str) -> bool:
    """Put the section into the environment, where the transformers W&B integration (training) reads it.

    A WANDB_MODE already in the environment wins, so `WANDB_MODE=offline` keeps any recipe off the network.
    Returns whether W&B is on.
    """
    if not config.enabled or effective_mode(config) == "disabled":
        return False
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
