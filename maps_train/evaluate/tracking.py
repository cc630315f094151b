"""Experiment tracking as a thin, switchable layer: W&B when enabled, a no-op with the same methods otherwise.

One W&B run per system, grouped by suite name: the system's spec and resolved recipe as config, its Cover-EM /
EM / F1 / answer length / cost per data set and on average as summary metrics, the per-question results as a
`wandb.Table`, and the suite's Cover-EM-against-cost plot as an image. `WANDB_MODE` (e.g. `offline`, set by the
tests and the Makefile) wins over the suite's `wandb.mode`; offline runs land in `<out_dir>/wandb/wandb/offline-run-*`
and can be uploaded later with `wandb sync`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol


@dataclass
class SuiteWandbConfig:
    enabled: bool = False
    project: str = "maps-train-eval"
    entity: str | None = None
    group: str | None = None  # the suite name when null
    mode: Literal["online", "offline", "disabled"] = "offline"
    dir: str | None = None  # <out_dir>/wandb when null
    tags: list[str] | None = None


class Tracker(Protocol):
    def start_run(self, name: str, config: dict[str, Any]) -> None: ...
    def log_summary(self, metrics: dict[str, Any]) -> None: ...
    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None: ...
    def log_image(self, key: str, path: str | Path) -> None: ...
    def finish_run(self) -> None: ...


class NullTracker:
    """Tracking switched off: every method accepts the same arguments and does nothing."""

    def __init__(self) -> None:
        self.run_dirs: list[Path] = []

    def start_run(self, name: str, config: dict[str, Any]) -> None:
        pass

    def log_summary(self, metrics: dict[str, Any]) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        pass

    def log_image(self, key: str, path: str | Path) -> None:
        pass

    def finish_run(self) -> None:
        pass


class WandbTracker:
    def __init__(self, config: SuiteWandbConfig, group: str, out_dir: Path):
        self.config = config
        self.group = config.group or group
        self.dir = Path(config.dir) if config.dir else out_dir / "wandb"
        self.mode = os.environ.get("WANDB_MODE") or config.mode
        self.run = None
        self.run_dirs: list[Path] = []

    def start_run(self, name: str, config: dict[str, Any]) -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.config.project,
            entity=self.config.entity,
            group=self.group,
            name=name,
            job_type="eval",
            tags=self.config.tags,
            config=config,
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

    def log_image(self, key: str, path: str | Path) -> None:
        import wandb

        if self.run is not None and Path(path).is_file():
            self.run.log({key: wandb.Image(str(path))})

    def finish_run(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def make_tracker(config: SuiteWandbConfig, group: str, out_dir: str | Path) -> Tracker:
    mode = os.environ.get("WANDB_MODE") or config.mode
    if not config.enabled or mode == "disabled":
        return NullTracker()
    return WandbTracker(config, group, Path(out_dir))
