"""`maps-train distill-on-policy RECIPE`: on-policy iterations after the off-policy adapters (see `onpolicy`)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("distill-on-policy")
    def distill_on_policy(
        recipe: str = typer.Argument(..., help="A distillation recipe with an `onpolicy:` section."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. onpolicy.iterations=2"),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    ) -> None:
        """Run the student, label its role calls with the teacher, retrain; `onpolicy.iterations` times (resumable)."""
        import json

        from maps_train.distill.onpolicy import STATS_FILE, iteration_dir, markdown, run_iteration
        from maps_train.recipe import load_recipe
        from maps_train.train.launch import train_all

        loaded = load_recipe(recipe, overrides or [])
        stats = []
        for iteration in range(1, loaded.onpolicy.iterations + 1):
            def train(sft_dir, adapters_dir):
                extra = [f"train.sft_dir={sft_dir}", f"train.output_dir={adapters_dir}"]
                return train_all(recipe, "all", [*(overrides or []), *extra], echo=typer.echo)

            done = iteration_dir(loaded, iteration) / STATS_FILE
            stats.append(run_iteration(loaded, iteration, train=train, progress=progress))
            typer.echo(f"iteration {iteration}: {json.dumps(stats[-1].to_dict()['verdicts'])} -> {done.parent}")
        typer.echo(markdown(stats))
