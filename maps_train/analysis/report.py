"""Writing analysis results: Markdown and CSV tables, PNG plots (matplotlib Agg), and optional W&B logging."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from maps_train.plotting import pyplot


def write_table(out_dir: Path, stem: str, rows: list[dict[str, Any]], markdown: str) -> list[Path]:
    """`<stem>.md` and `<stem>.csv` under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
    md_path.write_text(markdown, encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        fields = list(rows[0]) if rows else []
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return [md_path, csv_path]


def plot_momentum(table, path: Path) -> Path:
    plt = pyplot()
    steps = [s.step for s in table.steps]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(steps, [s.s_train for s in table.steps], "o-", label="train")
    left.plot(steps, [s.s_test for s in table.steps], "s-", label="held-out")
    left.plot(steps, [s.s_test_no_momentum for s in table.steps], "x--", label="held-out, β=0")
    left.set(xlabel="step t", ylabel="S_t = cos(m_t, q_{t+1} - q_0)", title="Momentum alignment")
    left.set_xticks(steps)
    left.legend()
    colors = ["tab:blue" if s.identified else "tab:gray" for s in table.steps]
    right.bar(steps, [s.beta for s in table.steps], color=colors)
    right.set(xlabel="step t", ylabel="β_t", ylim=(0, 1), title="Fitted β_t (gray: not identified)")
    right.set_xticks(steps)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_momentum_methods(tables: dict, path: Path) -> Path:
    """Held-out S_t (solid) and S_t with β = 0 (dotted) per method, and β_t per method (grouped bars)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(len(tables), 1)
    if not tables:
        left.text(0.5, 0.5, "no method could be fitted", ha="center", va="center", transform=left.transAxes)
    for i, (method, table) in enumerate(tables.items()):
        steps = [s.step for s in table.steps]
        line = left.plot(steps, [s.s_test for s in table.steps], "o-", label=method)[0]
        left.plot(steps, [s.s_test_no_momentum for s in table.steps], ":", color=line.get_color())
        right.bar([t + (i - (len(tables) - 1) / 2) * width for t in steps], [s.beta for s in table.steps],
                  width=width, color=line.get_color(), label=method)
    left.set(xlabel="step t", ylabel="held-out S_t (dotted: β = 0)", title="Momentum alignment")
    right.set(xlabel="step t", ylabel="β_t", ylim=(0, 1), title="Fitted β_t (β_1 fixed when not identified)")
    steps = sorted({s.step for table in tables.values() for s in table.steps})
    for axis in (left, right):
        axis.set_xticks(steps)
        if tables:
            axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_drift(curves, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [
        ("drift", "accumulated Δ cos(m_t, q_0)"),
        ("evidence_similarity", "max cos(sub-query, gold passage)"),
        ("question_drift", "1 - cos(sub-query, question)"),
    ]
    if not curves:
        axes[0].text(0.5, 0.5, "no searched sub-queries", ha="center", va="center", transform=axes[0].transAxes)
    for method in dict.fromkeys(c.method for c in curves):
        mine = [c for c in curves if c.method == method]
        for axis, (field_name, label) in zip(axes, panels):
            points = [(c.round, getattr(c, field_name)) for c in mine if not math.isnan(getattr(c, field_name))]
            if points:
                axis.plot(*zip(*points), "o-", label=method)
            axis.set(xlabel="round", ylabel=label)
    axes[0].axhline(0.0, color="gray", linewidth=0.6)
    for axis in axes:
        axis.set_xticks(sorted({c.round for c in curves}))
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_stops(stats, path: Path) -> Path:
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(6, 3.5))
    max_round = max((max(s.histogram) for s in stats if s.histogram), default=1)
    width = 0.8 / max(len(stats), 1)
    for i, s in enumerate(stats):
        xs = [r + i * width for r in range(max_round + 1)]
        axis.bar(xs, [s.histogram.get(r, 0) / s.n for r in range(max_round + 1)], width=width, label=s.method)
    axis.set(xlabel="retrieval rounds executed", ylabel="share of questions", title="Stop rounds")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def log_to_wandb(
    name: str,
    tables: dict[str, list[dict[str, Any]]],
    images: dict[str, Path],
    project: str,
    out_dir: Path,
    config: dict[str, Any] | None = None,
    tracker=None,
) -> None:
    """One W&B run with the tables and plots, through the project's tracker (WANDB_MODE wins; offline works).
    `tracker`: an already made `maps_train.tracking.Tracker` (tests pass a recording one)."""
    from maps_train.tracking import WandbConfig, make_tracker

    tracker = tracker or make_tracker(WandbConfig(enabled=True, project=project), "analysis", out_dir)
    tracker.start_run(name, {"tables": sorted(tables), **(config or {})}, job_type="analysis")
    for key, rows in tables.items():
        if rows:
            columns = list(rows[0])
            # NaN (a round with no gold evidence) is not valid JSON: W&B gets None.
            tracker.log_table(key, columns, [[_finite(r.get(c)) for c in columns] for r in rows])
    for key, image in images.items():
        tracker.log_image(key, image)
    tracker.finish_run()
