"""`maps-train run`: a recipe's method over a questions file, answers and traces written resumably."""

from __future__ import annotations

import typer

from maps_train.records.answer import AnswerRecord


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        recipe: str = typer.Argument(..., help="Recipe YAML (agent.method picks MAPS, an ablation or a baseline)."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. agent.num_directions=1"),
        questions: str = typer.Option(..., "--questions", help="Questions JSONL (FlashRAG format)."),
        out: str = typer.Option(..., "--out", help="Output folder: answers.jsonl and traces.jsonl (resumed)."),
        limit: int = typer.Option(None, "--limit", help="Only the first N questions."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
        shard: str = typer.Option(None, "--shard", help="I/N: only shard I of N of the questions, written under "
                                  "OUT/shards/I-of-N (then `maps-train merge-shards OUT`)."),
    ) -> None:
        """Answer questions with the recipe's method; rerun the same command to resume."""
        from maps_train.agents.runner import run_method
        from maps_train.questions import load_questions
        from maps_train.recipe import load_recipe
        from maps_train.records.shards import Shard

        config = load_recipe(recipe, overrides or [])
        items = load_questions(questions, limit=limit)
        part = Shard.parse(shard)
        if part is not None:
            items, out = part.select(items), str(part.out_dir(out))
        records = run_method(config, items, out, progress=progress)
        summarize(records, out)

    @app.command("merge-shards")
    def merge_shards_command(
        out: str = typer.Argument(..., help="The run's folder: OUT/shards/I-of-N/ are merged into OUT."),
    ) -> None:
        """Merge the shards of a run (`--shard I/N` of traces, run or eval) into its own folder; finished questions
        only, each once (merging again adds nothing). Then `sft-data` or `maps-train report OUT` as usual."""
        from maps_train.records.shards import merge_shards

        for line in merge_shards(out).lines():
            typer.echo(line)


def summarize(records: list[AnswerRecord], out: str) -> None:
    if not records:
        typer.echo(f"no questions; nothing written to {out}")
        return
    n = len(records)
    rounds = sum(r.rounds or 0 for r in records) / n
    calls = sum(r.cost.calls for r in records) / n
    tokens = sum(r.cost.prompt_tokens + r.cost.completion_tokens for r in records) / n
    failures = sum(sum(r.parse_failures.values()) for r in records)
    typer.echo(
        f"{n} questions -> {out}: {rounds:.2f} rounds, {calls:.1f} calls, {tokens:.0f} tokens per question; "
        f"{failures} parse failures"
    )
