"""Reward curves of an RL run as one PNG per role, from the Trainer's own `log_history`.

W&B draws the same curves when it is on; this PNG is what a run leaves without W&B (the demo runs it offline) and what
docs/rl.md shows. `maps-train rl` draws it when a role finishes (`<rl.output_dir>/curves-<role>.png`);
`maps-train rl RECIPE --plot-only` redraws it from `<rl.output_dir>/_trainer/<role>/trainer_state.json`, the newest
record the Trainer saved, so an interrupted run can be looked at too (its newest checkpoint's state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError
from maps_train.plotting import pyplot

# One panel each: (title, [(log_history key, legend label)]). Keys are what TRL's GRPOTrainer logs (`reward`,
# `rewards/<part>/mean` unweighted, `kl`, ...) and what maps_train.rl.trainer adds (`episode/*`, per question).
PANELS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("total reward (weighted)", (("reward", "reward"),)),
    ("reward parts (unweighted means)", (("rewards/correctness/mean", "correctness"), ("rewards/format/mean", "format"),
                                         ("rewards/cost/mean", "cost"), ("rewards/evidence/mean", "evidence"),
                                         ("rewards/process/mean", "process"))),
    ("Cover-EM per question", (("episode/cover_em", "Cover-EM"),)),
    ("rounds, retrievals per question", (("episode/rounds", "rounds"), ("episode/retrievals", "retrievals"))),
    ("tokens per question", (("episode/tokens", "tokens"),)),
    ("KL to the distilled policy", (("kl", "kl"),)),
    ("trained completion length (tokens)", (("completions/mean_length", "mean"),)),
    # The share of groups whose G rewards were all equal: GRPO's advantage is 0 there, so the step learns nothing.
    ("groups with zero reward spread", (("frac_reward_zero_std", "share"),)),
)


def read_log_history(state_file: Path) -> list[dict[str, Any]]:
    """The `log_history` of a Trainer's `trainer_state.json`; a missing or malformed file is a one-line error."""
    if not state_file.is_file():
        raise MapsTrainError(f"{state_file}: no trainer_state.json (has this RL role logged a step yet?)")
    try:
        state = safejson.loads(state_file.read_bytes())
    except ValueError as err:
        raise MapsTrainError(f"{state_file}: not a Trainer state file: {err}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise MapsTrainError(f"{state_file}: no log_history list (not a Trainer state file)")
    return [row for row in history if isinstance(row, dict)]


def metric_series(log_history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key` over the logged steps; rows without it (the end-of-training summary) are left out."""
    points = [(row["step"], row[key]) for row in log_history
              if isinstance(row.get("step"), (int, float)) and isinstance(row.get(key), (int, float))]
    return [float(step) for step, _ in points], [float(value) for _, value in points]


def plot_rl_curves(log_history: Sequence[Mapping[str, Any]], out_png: Path, title: str) -> Path:
    """Draw the PANELS of `log_history` into `out_png`; a history without one logged reward is a one-line error."""
    if not metric_series(log_history, "reward")[0]:
        raise MapsTrainError(f"{out_png}: the log history has no logged step with a reward to plot")
    plt = pyplot()
    columns = 4
    rows = -(-len(PANELS) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, (panel_title, series) in zip(axes.flat, PANELS):
        for key, label in series:
            steps, values = metric_series(log_history, key)
            if steps:
                ax.plot(steps, values, marker="o", markersize=3, linewidth=1.2, label=label)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
