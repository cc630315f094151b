"""`maps-train plan RECIPE_OR_SUITE [overrides] [--gpus N] [--gpu-memory-gb G] [--memory-gb M]`."""

from __future__ import annotations

import sys

import typer

from maps_train.errors import MapsTrainError


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        path: str = typer.Argument(..., help="A recipe or an eval suite YAML file."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.sft.max_length=2048"),
        gpus: int = typer.Option(None, "--gpus", help="GPUs (default: the recipe's hardware.gpus)."),
        gpu_memory_gb: float = typer.Option(None, "--gpu-memory-gb", help="Per GPU, 10^9 bytes (default: hardware)."),
        memory_gb: float = typer.Option(None, "--memory-gb", help="Host memory, 10^9 bytes (default: hardware)."),
    ) -> None:
        """Memory per device and placement of every stage (index, engines, training per adapter, serving), before
        anything starts: a table and exit 0 when it all fits, else one line per thing that does not (exit 2)."""
        from maps_train.plan.preflight import machine_warnings
        from maps_train.plan.rows import format_plan
        from maps_train.plan.stages import make_plan

        check_machine_options(gpus, gpu_memory_gb, memory_gb)
        plan = make_plan(path, overrides or [], gpus, gpu_memory_gb, memory_gb)
        for line in machine_warnings(plan.hardware):
            typer.echo(f"maps-train: warning: {line}", err=True)
        typer.echo(format_plan(plan), nl=False)
        for problem in plan.problems:
            typer.echo(f"maps-train: plan refused: {problem}", err=True)
        if plan.problems:
            sys.exit(2)


MAX_GIGABYTES = 1e9  # 10^18 bytes: far past any machine, and within what the plan's byte counts hold


def check_machine_options(gpus: int | None, gpu_memory_gb: float | None, memory_gb: float | None) -> None:
    """The machine given on the command line, checked as numbers (as `hardware:` is when a recipe loads): a count
    of GPUs is an integer >= 0, a memory size a number > 0 and at most MAX_GIGABYTES (a size past it, such as
    1e308, overflowed the plan's integer byte counts); anything else is one line naming the flag."""
    if gpus is not None and gpus < 0:
        raise MapsTrainError(f"--gpus: must be an integer >= 0, got {gpus}")
    for flag, value in (("--gpu-memory-gb", gpu_memory_gb), ("--memory-gb", memory_gb)):
        if value is not None and not 0 < value <= MAX_GIGABYTES:
            raise MapsTrainError(f"{flag}: must be a number of gigabytes > 0 and at most {MAX_GIGABYTES:,.0f}, "
                                 f"got {value}")
