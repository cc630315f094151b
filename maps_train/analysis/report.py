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


def plot_drift(curves, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    panels = [
        ("question_drift", "1 - cos(sub-query, question)"),
        ("momentum_turn", "accumulated 1 - cos(m_t, m_{t-1})"),
        ("evidence_similarity", "max cos(sub-query, gold passage)"),
    ]
    for method in dict.fromkeys(c.method for c in curves):
        mine = [c for c in curves if c.method == method]
        for axis, (field_name, label) in zip(axes, panels):
            points = [(c.round, getattr(c, field_name)) for c in mine if not math.isnan(getattr(c, field_name))]
            if points:
                axis.plot(*zip(*points), "o-", label=method)
            axis.set(xlabel="round", ylabel=label)
    for axis in axes:
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_stops(stats, path: Path) -> Path:
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(6, 3.5))
    max_round = max(max(s.histogram) for s in stats)
    width = 0.8 / len(stats)
    for i, s in enumerate(stats):
        xs = [r + i * width for r in range(max_round + 1)]
        axis.bar(xs, [s.histogram.get(r, 0) / s.n for r in range(max_round + 1)], width=width, label=s.method)
    axis.set(xlabel="stop round", ylabel="share of questions", title="Rounds before stopping")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def log_to_wandb(
    name: str, tables: dict[str, list[dict[str, Any]]], images: dict[str, Path], project: str, out_dir: Path
) -> None:
    """One W&B run with the tables and plots, through the project's tracker (WANDB_MODE wins; offline works)."""
    from maps_train.tracking import WandbConfig, make_tracker

    tracker = make_tracker(WandbConfig(enabled=True, project=project), "analysis", out_dir)
    tracker.start_run(name, {"tables": sorted(tables)}, job_type="analysis")
    for key, rows in tables.items():
        if rows:
            columns = list(rows[0])
            tracker.log_table(key, columns, [[r[c] for c in columns] for r in rows])
    for key, image in images.items():
        tracker.log_image(key, image)
    tracker.finish_run()
