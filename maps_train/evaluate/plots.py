"""PNG plots of a suite summary (matplotlib, Agg backend: no display needed).

- Cover-EM x 100 against cost per question, one panel per data set and one for the average, with the Pareto
  front (no other system is both cheaper and more accurate) drawn and its points ringed. Cost is the estimated
  compute (TFLOPs) when every system has it, else prompt + completion tokens.
- Evidence recall x 100 against the same cost, on the data sets whose questions have gold passages.
- The distribution of the round each question stopped at, per system.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from maps_train.evaluate.summary import AVG
from maps_train.plotting import pyplot


def pareto_front(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points (cost, score, name) not dominated by a point at most as costly and at least as good (one strictly)."""
    front = []
    for cost, score, name in points:
        dominated = any((c <= cost and s >= score) and (c < cost or s > score) for c, s, _ in points)
        if not dominated:
            front.append((cost, score, name))
    return sorted(front)


def cost_axis(summary: dict[str, Any]) -> tuple[str, str]:
    """("compute_tflops", label) when every cell knows its compute, else tokens."""
    cells = [c for s in summary["systems"] for c in summary["cells"][s].values()]
    if cells and all(c.get("compute_tflops") is not None for c in cells):
        return "compute_tflops", "estimated compute per question (TFLOPs)"
    return "tokens", "prompt + completion tokens per question"


def _cost(cell: dict[str, Any], key: str) -> float:
    if key == "tokens":
        return cell["prompt_tokens"] + cell["completion_tokens"]
    return cell[key]


def plot_cover_em_vs_cost(summary: dict[str, Any], path: str | Path) -> Path:
    def cover_em(system: str, panel: str) -> float | None:
        cell = summary["cells"][system].get(panel)
        return None if cell is None else 100 * cell["cover_em"]

    return _plot_score_vs_cost(summary, path, cover_em, "Cover-EM x 100", "Cover-EM against cost", summary["datasets"])


def plot_evidence_recall_vs_cost(summary: dict[str, Any], path: str | Path) -> Path:
    """Evidence recall (every hit of every search) x 100 against the same cost, on the data sets with gold."""
    evidence = summary.get("evidence", {})

    def recall(system: str, panel: str) -> float | None:
        cell = evidence.get(system, {}).get(panel)
        return None if cell is None or cell["evidence_recall"] is None else 100 * cell["evidence_recall"]

    datasets = [d for d in summary["datasets"] if any(d in cells for cells in evidence.values())]
    return _plot_score_vs_cost(summary, path, recall, "evidence recall x 100", "Evidence recall against cost", datasets)


def _plot_score_vs_cost(
    summary: dict[str, Any],
    path: str | Path,
    score_of: Callable[[str, str], float | None],
    score_label: str,
    title: str,
    datasets: list[str],
) -> Path:
    """One panel per data set (and Avg) of `score_of(system, panel)` against the cell's cost, Pareto front drawn."""
    plt = pyplot()
    key, label = cost_axis(summary)
    # The average panel only adds something when there is more than one data set.
    panels = datasets + ([AVG] if len(datasets) > 1 else [])
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    # at least 7.5 inches wide, so the legend row below fits even with one panel
    fig, axes = plt.subplots(rows, columns, figsize=(max(4.2 * columns, 7.5), 3.6 * rows), squeeze=False)
    colours = plt.get_cmap("tab10")
    for index, panel in enumerate(panels):
        ax = axes[index // columns][index % columns]
        points = []
        for number, system in enumerate(summary["systems"]):
            cell, score = summary["cells"][system].get(panel), score_of(system, panel)
            if cell is None or score is None:
                continue
            point = (_cost(cell, key), score, system)
            points.append(point)
            ax.scatter(point[0], point[1], color=colours(number % 10), label=system, zorder=3)
        for point, offset in zip(points, _label_offsets(points)):
            ax.annotate(point[2], point[:2], textcoords="offset points", xytext=offset, fontsize=7)
        front = pareto_front(points)
        if front:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", lw=1, ls="--", zorder=2)
            ax.scatter(
                [p[0] for p in front], [p[1] for p in front], s=140, facecolors="none", edgecolors="black", zorder=4
            )
        if points and min(p[0] for p in points) > 0 and max(p[0] for p in points) / min(p[0] for p in points) > 20:
            ax.set_xscale("log")
        ax.margins(x=0.15, y=0.12)  # room for the names beside the points
        ax.set_title(summary["labels"].get(panel, panel))
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel(score_label, fontsize=8)
        ax.grid(alpha=0.3)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.suptitle(f"{title}{': ' + summary['suite'] if summary['suite'] else ''} (dashed: Pareto front)")
    legend_rows = math.ceil(len(labels) / 5) if handles else 0
    fig.tight_layout(rect=(0, 0.02 + 0.06 * legend_rows / rows, 1, 0.95))  # keep the legend clear of the axes
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label_offsets(points: list[tuple[float, float, str]]) -> list[tuple[int, int]]:
    """Name offsets (points) that stack the names of systems lying close together instead of overprinting them."""
    if not points:
        return []
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    offsets = []
    for index, (x, y, _) in enumerate(points):
        close = sum(abs(x - other[0]) < 0.12 * span_x and abs(y - other[1]) < 0.06 * span_y for other in points[:index])
        offsets.append((4, 4 - 9 * close))
    return offsets


def plot_stop_rounds(summary: dict[str, Any], path: str | Path) -> Path:
    plt = pyplot()
    systems = [s for s in summary["systems"] if summary["cells"][s][AVG]["rounds"]]
    rounds = sorted({int(r) for s in systems for r in summary["cells"][s][AVG]["rounds"]})
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(rounds) * max(len(systems), 1) + 2), 3.8))
    width = 0.8 / max(len(systems), 1)
    for number, system in enumerate(systems):
        counts = summary["cells"][system][AVG]["rounds"]
        total = sum(counts.values())
        shares = [100 * counts.get(str(r), 0) / total for r in rounds]
        ax.bar([r + (number - (len(systems) - 1) / 2) * width for r in rounds], shares, width=width, label=system)
    if not systems:
        ax.text(0.5, 0.5, "no system reported rounds", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks(rounds)
    ax.set_xlabel("retrieval rounds executed")
    ax.set_ylabel("share of questions (%)")
    ax.set_title("Stop rounds" + (f": {summary['suite']}" if summary["suite"] else ""))
    if systems:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
