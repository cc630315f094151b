"""Report files of a suite: Markdown, CSV and JSON tables and the PNG plots, rebuilt from results.jsonl.

Layout of `OUT_DIR`:
    results.jsonl           per-question results (the source of truth; everything below is derived)
    suite.yaml              the resolved suite (order and labels of systems and data sets)
    report.md               Table 3.1 layout (rows systems, columns data sets + Avg, Cover-EM x 100), evidence
                            recall (retrieved and seen, on the data sets with gold passages), then EM,
                            F1, answer length, cost per question, cost per role, stop rounds, prompts shrunk
                            to fit the context, calls that hit max_tokens (in the reasoning, at all)
    table_cover_em.csv      the Cover-EM table as in the paper
    summary.csv             one row per (system, data set or Avg): every metric and cost column
    summary.json            the same, nested
    cover_em_vs_cost.png    Cover-EM against cost per data set and on average, Pareto front marked
    evidence_recall_vs_cost.png  the same for evidence recall (only when some data set has gold passages)
    stop_rounds.png         distribution of the round each question stopped at, per system
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from maps_train.errors import MapsTrainError
from maps_train.evaluate.evidence_recall import evidence_cells
from maps_train.evaluate.results import read_results
from maps_train.evaluate.summary import AVG, SCORE_KEYS, summarize
from maps_train.records.answer import COST_KEYS, ROLE_KEYS

RESULTS = "results.jsonl"
SUITE_MANIFEST = "suite.yaml"


@dataclass
class ReportFiles:
    markdown: Path
    cover_em_csv: Path
    summary_csv: Path
    summary_json: Path
    cost_plot: Path
    rounds_plot: Path
    evidence_plot: Path | None = None  # only when some data set's questions have gold passages

    def all(self) -> list[Path]:
        files = [self.markdown, self.cover_em_csv, self.summary_csv, self.summary_json, self.cost_plot,
                 self.rounds_plot]
        return files + ([self.evidence_plot] if self.evidence_plot else [])


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _fmt_significant(value: float | None) -> str:
    """Three significant figures: compute spans 1e-4 TFLOPs (a tiny model) to 1e3 (a 32B model, long prompts)."""
    return "-" if value is None else f"{value:.3g}"


def _metric_table(summary: dict[str, Any], key: str, scale: float, digits: int, higher_is_better: bool = True) -> list[str]:
    columns = summary["datasets"] + [AVG]
    header = ["System"] + [summary["labels"].get(d, d) for d in summary["datasets"]] + [AVG]
    best = {}
    for column in columns:
        values = [summary["cells"][s][column][key] for s in summary["systems"] if column in summary["cells"][s]]
        if values and higher_is_better and len(set(values)) > 1:  # bold the best, unless all are equal
            best[column] = max(values)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * len(columns)]
    for system in summary["systems"]:
        row = [system]
        for column in columns:
            cell = summary["cells"][system].get(column)
            if cell is None:
                row.append("-")
                continue
            text = _fmt(cell[key] * scale, digits)
            if column == AVG and cell.get("datasets", 0) < len(summary["datasets"]):
                text += "*"  # averaged over fewer data sets than the other columns show
            row.append(f"**{text}**" if cell[key] == best.get(column) else text)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _cost_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| System | Calls | Prompt tokens | Completion tokens | Retrievals | Passages | Latency (s) | TFLOPs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in summary["systems"]:
        c = summary["cells"][system][AVG]
        lines.append(
            f"| {system} | {_fmt(c['calls'])} | {_fmt(c['prompt_tokens'], 0)} | {_fmt(c['completion_tokens'], 0)} | "
            f"{_fmt(c['retrievals'])} | {_fmt(c['passages'])} | {_fmt(c['latency_s'], 2)} | {_fmt_significant(c['compute_tflops'])} |"
        )
    return lines


def _role_table(summary: dict[str, Any]) -> list[str]:
    lines = ["| System | Role | Calls | Prompt tokens | Completion tokens |", "|---|---|---:|---:|---:|"]
    for system in summary["systems"]:
        for role, usage in summary["cells"][system][AVG]["by_role"].items():
            lines.append(
                f"| {system} | {role} | {_fmt(usage['calls'])} | {_fmt(usage['prompt_tokens'], 0)} | "
                f"{_fmt(usage['completion_tokens'], 0)} |"
            )
    return lines


def _rounds_table(summary: dict[str, Any]) -> list[str]:
    rounds = sorted({int(r) for s in summary["systems"] for r in summary["cells"][s][AVG]["rounds"]})
    lines = ["| System | " + " | ".join(f"round {r}" for r in rounds) + " | stop reasons |", "|---|" + "---:|" * len(rounds) + "---|"]
    for system in summary["systems"]:
        cell = summary["cells"][system][AVG]
        total = sum(cell["rounds"].values()) or 1
        shares = [f"{100 * cell['rounds'].get(str(r), 0) / total:.0f}%" for r in rounds]
        reasons = ", ".join(f"{k} {v}" for k, v in cell["stop_reasons"].items())
        lines.append(f"| {system} | " + " | ".join(shares) + f" | {reasons} |")
    return lines


def _truncation_table(summary: dict[str, Any]) -> list[str]:
    """Per system, over all its data sets: calls whose prompt was shrunk to fit the context, and what they lost."""
    lines = [
        "| System | Truncated calls | Questions with one | Prompt tokens dropped per truncated call |",
        "|---|---:|---:|---:|",
    ]
    for system in summary["systems"]:
        counts = summary["cells"][system][AVG]["truncation"]
        per_call = counts["prompt_tokens_dropped"] / counts["calls"] if counts["calls"] else None
        lines.append(f"| {system} | {counts['calls']} | {counts['questions']} | {_fmt(per_call, 0)} |")
    return lines


def _caps_table(summary: dict[str, Any]) -> list[str]:
    """Per system and role, over all its data sets: calls that hit max_tokens inside the reasoning, and at all;
    stop strings that fired inside the reasoning (a tag the model restated while thinking: written past)."""
    lines = [
        "| System | Role | Reasoning-capped calls | Length-capped calls | Stops inside reasoning |",
        "|---|---|---:|---:|---:|",
    ]
    for system in summary["systems"]:
        caps = summary["cells"][system][AVG]["caps"]
        for role, counts in sorted(caps["by_role"].items()):
            lines.append(
                f"| {system} | {role} | {counts['reasoning_capped_calls']} | {counts['length_capped_calls']} | "
                f"{counts.get('stops_in_reasoning', 0)} |"
            )
        lines.append(
            f"| {system} | all | {caps['reasoning_capped_calls']} | {caps['length_capped_calls']} | "
            f"{caps.get('stops_in_reasoning', 0)} |"
        )
    return lines


def _evidence_table(summary: dict[str, Any]) -> list[str]:
    """Per system, evidence recall x 100 at what its searches retrieved and at what its answer step saw, per data
    set with gold passages and on average (n: questions with gold)."""
    evidence = summary.get("evidence", {})
    datasets = [d for d in summary["datasets"] if any(d in cells for cells in evidence.values())]
    columns = datasets + [AVG]
    header = ["System", "Passages"] + [summary["labels"].get(d, d) for d in datasets] + [AVG]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * len(columns)]
    for system in summary["systems"]:
        cells = evidence.get(system)
        if not cells:
            continue
        for key, what in (("evidence_recall", "retrieved"), ("evidence_recall_seen", "seen by the answer step")):
            row = [system, what]
            for column in columns:
                cell = cells.get(column)
                value = None if cell is None or cell[key] is None else 100 * cell[key]
                row.append(_fmt(value) + (f" (n={cell['n']})" if cell is not None and column != AVG else ""))
            lines.append("| " + " | ".join(row) + " |")
    return lines


def _evidence_section(summary: dict[str, Any]) -> list[str]:
    if not summary.get("evidence"):
        return []
    return [
        "## Evidence recall x 100",
        "",
        (
            "Share of each question's gold passages (supporting facts / paragraphs) found: among every hit of "
            "every search (retrieved), and among the passages the answer's input was made from (seen: MAPS, what "
            "its consolidators read; Search-o1, what its condenser read; S3, its generator's documents; the others, "
            "their retrieved passages). Matched by corpus id, else by FlashRAG-normalised title and text."
        ),
        "",
        *_evidence_table(summary),
        "",
    ]


def _departure_lines(summary: dict[str, Any]) -> list[str]:
    """Under the Cover-EM table: how each system that names a reference recipe departs from it."""
    lines = []
    for system, (reference, differences) in summary.get("departures", {}).items():
        if differences:
            lines.append(f"- {system} departs from {reference}: " + "; ".join(differences))
        else:
            lines.append(f"- {system} matches {reference} in every compared setting")
    return lines


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    n = {d: max((summary["cells"][s].get(d, {}).get("n", 0) for s in summary["systems"]), default=0) for d in summary["datasets"]}
    sizes = ", ".join(f"{summary['labels'][d]} {n[d]}" for d in summary["datasets"])
    parts = [
        f"# Evaluation: {summary['suite'] or path.parent.name}",
        "",
        (
            f"Questions per data set: {sizes}. Avg is the mean over the data sets a system ran on (* where that is "
            "not all of them). GPQA scores are letter accuracy. Costs are means per question."
        ),
        "",
        "## Cover-EM x 100",
        "",
        *_metric_table(summary, "cover_em", 100, 1),
        "",
        *[f"- {system}: {note}" for system, note in summary.get("notes", {}).items()],
        *_departure_lines(summary),
        *([""] if summary.get("notes") or summary.get("departures") else []),
        *_evidence_section(summary),
        "## EM x 100",
        "",
        *_metric_table(summary, "em", 100, 1),
        "",
        "## Token F1 x 100",
        "",
        *_metric_table(summary, "f1", 100, 1),
        "",
        "## Answer length (words)",
        "",
        *_metric_table(summary, "answer_words", 1, 1, higher_is_better=False),
        "",
        "## Cost per question (mean over data sets)",
        "",
        "TFLOPs: estimated forward compute, 2 x parameters x (prompt + completion tokens), summed over roles.",
        "",
        *_cost_table(summary),
        "",
        "## Cost per role (mean per question)",
        "",
        *_role_table(summary),
        "",
        "## Stop rounds (share of questions)",
        "",
        *_rounds_table(summary),
        "",
        "## Prompts shrunk to fit the context",
        "",
        (
            "Calls whose prompt was over `backend.max_model_len` minus the reply's `max_tokens`, over all data sets "
            "(`backend.truncate_prompt`: shrink leaves out the oldest observations and turns and the lowest-ranked "
            "passages first, never the question)."
        ),
        "",
        *_truncation_table(summary),
        "",
        "## Calls that hit max_tokens",
        "",
        (
            "Reasoning-capped: max_tokens came inside `<think>`; with `backend.reasoning_cap: answer` the reasoning "
            "was closed and the answer asked for in a follow-up call (its tokens are in the cost). Length-capped: "
            "max_tokens was hit at all. Stops inside reasoning: a stop string (a protocol's closing tag) fired "
            "inside unclosed `<think>` (the model restating a tag while thinking); generation continued past it "
            "and no action was taken from it."
        ),
        "",
        *_caps_table(summary),
        "",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")


def summary_rows(summary: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    roles = sorted({role for s in summary["systems"] for c in summary["cells"][s].values() for role in c["by_role"]})
    columns = ["system", "dataset", "n", *SCORE_KEYS, *COST_KEYS, "compute_tflops"]
    columns += [f"{role}_{key}" for role in roles for key in ROLE_KEYS]
    rows = []
    for system in summary["systems"]:
        for dataset, cell in summary["cells"][system].items():
            row = {"system": system, "dataset": dataset, **{k: cell.get(k) for k in columns[2:] if k in cell}}
            for role in roles:
                for key in ROLE_KEYS:
                    row[f"{role}_{key}"] = cell["by_role"].get(role, {}).get(key, 0.0)
            rows.append(row)
    return columns, rows


def write_csvs(summary: dict[str, Any], cover_em_path: Path, summary_path: Path) -> None:
    with cover_em_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["system"] + [summary["labels"][d] for d in summary["datasets"]] + [AVG])
        for system in summary["systems"]:
            cells = summary["cells"][system]
            writer.writerow(
                [system] + [f"{100 * cells[d]['cover_em']:.1f}" if d in cells else "" for d in summary["datasets"] + [AVG]]
            )
    columns, rows = summary_rows(summary)
    with summary_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def read_manifest(out_dir: Path) -> dict[str, Any]:
    path = out_dir / SUITE_MANIFEST
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def build_report(out_dir: str | Path) -> tuple[dict[str, Any], ReportFiles]:
    """Rebuild every table and plot of `out_dir` from its results.jsonl (and suite.yaml for order and labels)."""
    from maps_train.evaluate.plots import plot_cover_em_vs_cost, plot_evidence_recall_vs_cost, plot_stop_rounds

    out_dir = Path(out_dir)
    rows = read_results(out_dir / RESULTS)
    if not rows:
        raise MapsTrainError(f"{out_dir / RESULTS}: no results to report (run `maps-train eval SUITE.yaml` first)")
    manifest = read_manifest(out_dir)
    from maps_train.evaluate.datasets import dataset_info

    datasets = [d["name"] for d in manifest.get("datasets", [])]
    labels = {}
    for spec in manifest.get("datasets", []):
        info = dataset_info(spec["name"])
        labels[spec["name"]] = spec.get("label") or (info.label if info else spec["name"])
    for row in rows:
        if row["dataset"] not in labels:
            info = dataset_info(row["dataset"])
            labels[row["dataset"]] = info.label if info else row["dataset"]
    summary = summarize(
        rows,
        systems=[s["name"] for s in manifest.get("systems", [])],
        datasets=datasets,
        labels=labels,
        suite=manifest.get("name", ""),
    )
    summary["notes"] = {s["name"]: s["note"] for s in manifest.get("systems", []) if s.get("note")}
    summary["departures"] = {s["name"]: (s["departs_from"], s.get("departures") or [])
                             for s in manifest.get("systems", []) if s.get("departs_from")}
    summary["evidence"] = evidence_cells(rows, summary["systems"], summary["datasets"], AVG)
    files = ReportFiles(
        markdown=out_dir / "report.md",
        cover_em_csv=out_dir / "table_cover_em.csv",
        summary_csv=out_dir / "summary.csv",
        summary_json=out_dir / "summary.json",
        cost_plot=out_dir / "cover_em_vs_cost.png",
        rounds_plot=out_dir / "stop_rounds.png",
        evidence_plot=out_dir / "evidence_recall_vs_cost.png" if summary["evidence"] else None,
    )
    write_markdown(summary, files.markdown)
    write_csvs(summary, files.cover_em_csv, files.summary_csv)
    files.summary_json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    plot_cover_em_vs_cost(summary, files.cost_plot)
    plot_stop_rounds(summary, files.rounds_plot)
    if files.evidence_plot is not None:
        plot_evidence_recall_vs_cost(summary, files.evidence_plot)
    return summary, files
