"""`maps-train eval SUITE.yaml [overrides]`, `maps-train score-traces TRACES -q Q -r RESULTS`, `maps-train compare A>B
-r OUT_DIR` and `maps-train report OUT_DIR`: thin wrappers over run_suite, trace scoring, the paired comparison and
build_report."""

from __future__ import annotations

import pathlib

import typer

from maps_train.preflight_hook import no_plan_option, preflight


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        suite: str = typer.Argument(..., help="A suite YAML, e.g. eval/suites/paper.yaml"),
        overrides: list[str] = typer.Argument(None, help="Dotted suite overrides, e.g. out_dir=runs/x wandb.enabled=true"),
        system: list[str] = typer.Option(None, "--system", "-s", help="Run only this system (repeatable)."),
        dataset: list[str] = typer.Option(None, "--dataset", "-d", help="Run only this data set (repeatable)."),
        sample: int = typer.Option(None, "--sample", "-n", help="Questions per data set (replaces every `sample`)."),
        progress: bool = typer.Option(True, help="Progress bars."),
        shard: str = typer.Option(None, "--shard", help="I/N: only shard I of N of every sample, written under "
                                  "OUT_DIR/shards/I-of-N (then `maps-train merge-shards OUT_DIR`)."),
        no_plan: bool = no_plan_option(),
    ) -> None:
        """Run (or resume) the systems x data sets matrix of a suite, then write its tables and plots."""
        from maps_train.errors import MapsTrainError
        from maps_train.evaluate.suite import load_suite, load_system_recipe
        from maps_train.llm.router import annotation_refusal
        for i, spec in enumerate(load_suite(suite, overrides or []).systems):  # the gold annotations never score
            recipe = load_system_recipe(spec, i, pathlib.Path(suite)) if spec.routes == "recipe" else None
            if recipe and (refusal := annotation_refusal(recipe, "in an evaluation")):
                raise MapsTrainError(f"{suite}: systems[{i}] ({spec.name}): {refusal}")
        preflight("eval", suite, overrides, skip=no_plan)
        from maps_train.evaluate.suite import run_suite
        from maps_train.records.shards import Shard

        outcome = run_suite(
            suite, overrides or [], systems=system or None, datasets=dataset or None, sample_size=sample,
            progress=progress, shard=Shard.parse(shard),
        )
        typer.echo(outcome.files.markdown.read_text(encoding="utf-8"))
        typer.echo(f"{outcome.scored} new results; report in {outcome.out_dir}")

    @app.command("score-traces")
    def score_traces_command(
        traces_dir: str = typer.Argument(..., help="A traces folder (maps-train traces' traces.out_dir, or one run)"),
        questions: list[str] = typer.Option(..., "--questions", "-q", help="The questions files the traces answered "
                                            "(their gold answers and passages; repeatable)"),
        system: str = typer.Option("teacher", "--system", help="The system name of the rows"),
        results: str = typer.Option(..., "--results", "-r", help="The results.jsonl to append to (an eval suite's)"),
        corpus: str = typer.Option(None, "--corpus", help="The corpus, where gold passages carry no corpus id"),
    ) -> None:
        """Score a teacher's traces as eval rows (EM, F1, Cover-EM, cost, evidence recall) of one system, appended
        to a suite's results.jsonl (resumable: rows already there are not written again)."""
        from maps_train.evaluate.trace_scoring import score_traces

        written, unknown = score_traces(pathlib.Path(traces_dir), questions, system, pathlib.Path(results), corpus)
        if unknown:
            typer.echo(f"{unknown} answered questions are in none of the questions files: not scored", err=True)
        typer.echo(f"{written} new rows of system '{system}' in {results}")

    @app.command("compare")
    def compare_command(
        pairs: list[str] = typer.Argument(..., help='"A>B": B against A, paired by question; a side may join systems '
                                          'with + ("rl_s0+rl_s1+rl_s2": their per-question mean, e.g. seeds)'),
        results: list[str] = typer.Option(..., "--results", "-r", help="A suite's out_dir or its results.jsonl; "
                                          "LABEL=PATH names its systems LABEL/<system> (repeatable; sources whose "
                                          "systems share a name need labels). A path that exists is read as a path "
                                          "even with '=' in it; else the label ends at the first '=' "
                                          "(run1=./a=b)."),
        measure: list[str] = typer.Option(None, "--measure", "-m", help="Measures (default: evidence_recall, em, "
                                          "f1, rounds, retrievals, tokens)."),
        dataset: list[str] = typer.Option(None, "--dataset", "-d", help="Only these data sets (repeatable)."),
        transfer_to: str = typer.Option(None, "--transfer", help="BASE>TEACHER: also each pair's B as transfer, "
                                        "(B - BASE) / (TEACHER - BASE) per measure, with its paired bootstrap "
                                        "interval (e.g. maps_base>teacher)."),
    ) -> None:
        """Paired bootstrap 95% intervals of B - A between systems of one or more eval runs."""
        from maps_train.errors import MapsTrainError
        from maps_train.evaluate.paired import SCORES, check_systems, comparison_table, parse_pair, transfer_table
        from maps_train.evaluate.results import read_labelled_results, split_source

        labels: dict[str, str] = {}
        owner: dict[str, str] = {}  # system -> the source that holds it
        rows = []
        for source in results:
            label, _ = split_source(source)
            if label and label in labels:
                raise MapsTrainError(f"--results {source}: label '{label}' already names --results {labels[label]}; "
                                     "give each source its own label")
            labels[label] = source
            read = read_labelled_results(source)
            for system in dict.fromkeys(str(row["system"]) for row in read):
                if system in owner:
                    raise MapsTrainError(f"--results {owner[system]} and --results {source} both hold system "
                                         f"'{system}'; label them (e.g. -r one={owner[system]} -r two={source})")
                owner[system] = source
            rows += read
        parsed = [parse_pair(pair) for pair in pairs]
        towards = parse_pair(transfer_to) if transfer_to else None
        check_systems(rows, parsed + ([towards] if towards else []))
        measures = measure or ["evidence_recall", "em", "f1", "rounds", "retrievals", "tokens"]
        datasets = set(dataset) if dataset else None
        typer.echo(comparison_table(rows, parsed, measures, datasets=datasets))
        if towards:
            scores = [name for name in measures if name in SCORES] or ["evidence_recall"]  # costs have no transfer
            systems = list(dict.fromkeys(b for _, b in parsed))
            typer.echo("\n" + transfer_table(rows, systems, *towards, scores, datasets=datasets))

    @app.command("report")
    def report_command(out_dir: str = typer.Argument(..., help="A suite's out_dir (holds results.jsonl)")) -> None:
        """Rebuild a suite's Markdown/CSV/JSON tables and PNG plots from its results.jsonl."""
        from maps_train.evaluate.report import build_report

        _, files = build_report(out_dir)
        typer.echo(files.markdown.read_text(encoding="utf-8"))
        typer.echo("wrote " + ", ".join(str(p) for p in files.all()))

    @app.command("eval-recall")
    def eval_recall_command(
        realdata: str = typer.Option("../shared/realdata", help="Folder with the QA sets and corpus/corpus.jsonl"),
        per_dataset: int = typer.Option(100, help="Questions per dataset (with gold passages); 0 = all"),
        subset: bool = typer.Option(True, help="Index only the sampled questions' paragraphs + wiki18 passages"),
        encoder: str = typer.Option("builtin:minilm-l6"),
        kinds: str = typer.Option("dense,bm25", help="Comma-separated: dense, bm25"),
        work_dir: str = typer.Option("runs/recall", help="Where the subset corpus and indexes go"),
        seed: int = typer.Option(0),
        out: str | None = typer.Option(None, help="Also write the Markdown table here"),
    ) -> None:
        """Recall@5 / @20 of the gold supporting passages, per dataset, as a Markdown table."""
        from pathlib import Path

        from maps_train.evaluate.recall import eval_recall, format_table
        from maps_train.recipe import RetrievalConfig

        rows = eval_recall(
            realdata,
            work_dir,
            per_dataset=per_dataset or None,
            settings=RetrievalConfig(encoder=encoder),
            kinds=tuple(kind.strip() for kind in kinds.split(",") if kind.strip()),
            subset=subset,
            seed=seed,
        )
        table = format_table(rows)
        typer.echo(table)
        if out:
            Path(out).write_text(table + "\n", encoding="utf-8")
