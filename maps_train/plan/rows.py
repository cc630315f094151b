"""What a plan is made of: one row per process (or per device's sum), and the few ways rows are written."""

from __future__ import annotations

from dataclasses import dataclass, field

from maps_train.plan.memory import GB
from maps_train.recipe import HardwareConfig


@dataclass
class Row:
    """One process (or one device's sum) of a stage: its peak per device against what it may use there."""

    stage: str
    process: str
    where: str
    per_device: float
    budget: float
    note: str = ""
    problem: str | None = None


@dataclass
class Plan:
    name: str
    hardware: HardwareConfig
    rows: list[Row] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [row.problem for row in self.rows if row.problem]


def gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def gpu_range(first: int, count: int) -> str:
    return f"GPU {first}" if count == 1 else f"GPU {first}-{first + count - 1}"


def host_row(stage: str, process: str, need: float, hardware: HardwareConfig, note: str = "",
             fix: str = "a machine with more memory (hardware.memory_gb, --memory-gb)") -> Row:
    """A process in host memory, refused (with `fix`) when it needs more than the machine's memory."""
    budget = hardware.memory_gb * GB
    problem = None
    if need > budget:
        problem = (f"{stage}: {process} needs {gb(need)} of host memory, {gb(need - budget)} over the "
                   f"{hardware.memory_gb:g} GB of hardware.memory_gb; {fix}")
    return Row(stage, process, "host", need, budget, note, problem)


def equal_runs(values: list[float]) -> list[tuple[int, int, float]]:
    """(first, count, value) for each run of equal neighbours: GPUs that hold the same are one row."""
    runs: list[tuple[int, int, float]] = []
    for index, value in enumerate(values):
        if runs and abs(runs[-1][2] - value) < 1e6:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
        else:
            runs.append((index, 1, value))
    return runs


def format_plan(plan: Plan) -> str:
    """The plan as a fixed-width table."""
    hw = plan.hardware
    machine = (f"{hw.gpus} x {hw.gpu_memory_gb:g} GB GPU, " if hw.gpus else "CPUs only, ") + f"{hw.memory_gb:g} GB host"
    header = ("stage", "process", "where", "per device", "of", "fits", "notes")
    lines = [(r.stage, r.process, r.where, gb(r.per_device), gb(r.budget), "no" if r.problem else "yes", r.note)
             for r in plan.rows]
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header) - 1)]
    out = [f"plan: {plan.name} on {machine}"]
    for row in [header, *lines]:
        out.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in out) + "\n"
