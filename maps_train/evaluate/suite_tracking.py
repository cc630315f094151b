"""A suite's results in W&B: one run per system (its config, the adapters it ran with, the results artifact, the
metrics per data set, a results table, Cover-EM against tokens and the report's plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maps_train.config.yaml_io import to_dict
from maps_train.evaluate.evidence_recall import RECALL_KEYS
from maps_train.evaluate.report import RESULTS, ReportFiles
from maps_train.evaluate.results import read_results
from maps_train.evaluate.suite_spec import SuiteConfig
from maps_train.tracking import Tracker, artifact_name


def log_suite_runs(tracker: Tracker, suite: SuiteConfig, recipes: dict, summary: dict, files: ReportFiles, out_dir: Path) -> None:
    rows = read_results(out_dir / RESULTS)
    columns = [
        "dataset", "question_id", "question", "golden_answers", "answer", "cover_em", "em", "f1", "answer_words",
        "rounds", "stop_reason", "calls", "prompt_tokens", "completion_tokens", "retrievals", "latency_s", "compute_tflops",
    ]
    for spec in suite.systems:
        if spec.name not in summary["cells"]:
            continue
        tracker.start_run(
            spec.name,
            {"suite": suite.name, "system": to_dict(spec), "recipe": to_dict(recipes[spec.name]),
             "datasets": to_dict(suite.datasets)},
            job_type="eval",
        )
        if spec.routes in ("distilled", "distilled_server"):  # link the results to the adapters they came from
            from maps_train.adapters import distilled_set
            from maps_train.train.sft import adapter_artifacts

            adapter_set = distilled_set(recipes[spec.name]).swapped(spec.adapters)
            for name, folder in adapter_artifacts(recipes[spec.name], adapter_set):
                tracker.use_artifact(name, "adapter", folder)
        tracker.log_artifact(artifact_name("eval", f"{suite.name}-{spec.name}"), "eval", out_dir / RESULTS)
        metrics: dict[str, Any] = {}
        for dataset, cell in summary["cells"][spec.name].items():
            label = summary["labels"].get(dataset, dataset)
            for key in ("cover_em", "em", "f1", "answer_words", "n", "calls", "prompt_tokens", "completion_tokens",
                        "retrievals", "passages", "latency_s", "compute_tflops"):
                if cell.get(key) is not None:
                    metrics[f"{label}/{key}"] = cell[key]
        for dataset, cell in summary.get("evidence", {}).get(spec.name, {}).items():
            label = summary["labels"].get(dataset, dataset)
            metrics.update({f"{label}/{key}": cell[key] for key in RECALL_KEYS if cell[key] is not None})
        tracker.log_summary(metrics)
        table = [
            [r["dataset"], r["question_id"], r["question"], " | ".join(r["golden_answers"]), r["answer"], r["cover_em"],
             r["em"], r["f1"], r["answer_words"], r.get("rounds"), r.get("stop_reason"), r["cost"]["calls"],
             r["cost"]["prompt_tokens"], r["cost"]["completion_tokens"], r["cost"]["retrievals"], r["cost"]["latency_s"],
             None if r.get("compute_flops") is None else r["compute_flops"] / 1e12]
            for r in rows if r["system"] == spec.name
        ]
        tracker.log_table("results", columns, table)
        # Per question, Cover-EM against tokens: W&B's own scatter, so any other column can be tried in the UI.
        tracker.log_scatter("cover_em_vs_tokens", ["question_id", "dataset", "tokens", "cover_em", "compute_tflops"],
                            [[row[1], row[0], row[12] + row[13], row[5], row[16]] for row in table],
                            x="tokens", y="cover_em", title=f"{spec.name}: Cover-EM vs tokens per question")
        tracker.log_image("cover_em_vs_cost", files.cost_plot)
        if files.evidence_plot is not None:
            tracker.log_image("evidence_recall_vs_cost", files.evidence_plot)
        tracker.log_image("stop_rounds", files.rounds_plot)
        tracker.finish_run()
