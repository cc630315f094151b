"""The pre-flight check a stage command runs first in its body, as the stage packages' commands reach it.

`maps-train traces`, `train`, `serve`, `eval` and `rl` each declare `--no-plan` (`no_plan_option`) and call
`preflight` first. The check itself is `maps_train.plan.preflight.preflight`: the memory plan, which plans every
stage and so sits above them all. The command line (`maps_train.cli`, the top layer) installs it here before it
registers the stage commands, so no stage imports upward; a stage command run without it installed is an error,
never a silently skipped check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from maps_train.errors import MapsTrainError

_installed: list[Callable[..., None]] = []


def install(check: Callable[..., None]) -> None:
    """Make `check` (with `preflight`'s signature) the pre-flight every stage command runs."""
    _installed[:] = [check]


def preflight(stage: str, path: str, overrides: list[str] | None, *, skip: bool,
              accelerate_config: str | None = None, num_machines: int | None = None) -> None:
    """The installed check for the command of `stage` (`plan.preflight.preflight`)."""
    if not _installed:
        raise MapsTrainError(f"{stage}: no pre-flight check installed (commands run through maps_train.cli)")
    _installed[0](stage, path, overrides, skip=skip, accelerate_config=accelerate_config,
                  num_machines=num_machines)


def no_plan_option() -> Any:
    """The `--no-plan` option of every command that runs `preflight`."""
    return typer.Option(False, "--no-plan", help="Skip the memory plan checked before anything starts (also "
                        "MAPS_TRAIN_NO_PLAN=1), e.g. on hardware other than the recipe's hardware:.")
