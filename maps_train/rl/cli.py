"""`maps-train rl RECIPE [overrides]`: GRPO on the role adapters with MAPS as the environment (see `trainer`)."""

from __future__ import annotations

import typer

from maps_train.preflight_hook import no_plan_option, preflight


def register(app: typer.Typer) -> None:
    @app.command("rl")
    def rl(
        recipe: str = typer.Argument(..., help="A student recipe with an `rl:` section (its distilled adapters)."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. rl.grpo.max_steps=20"),
        plot_only: bool = typer.Option(False, "--plot-only", help="Only redraw <rl.output_dir>/curves-<role>.png "
                                       "from the run's saved trainer_state.json (no training)."),
        no_plan: bool = no_plan_option(),
    ) -> None:
        """GRPO (TRL) on each role of rl.roles in turn; resumes from the newest checkpoint, skips finished roles."""
        preflight("rl", recipe, overrides, skip=no_plan)
        from maps_train.recipe import load_recipe
        from maps_train.rl.layout import plot_run_curves
        from maps_train.rl.trainer import rl_stage

        if plot_only:
            for png in plot_run_curves(load_recipe(recipe, overrides or [])):
                typer.echo(str(png))
            return
        summary = rl_stage(load_recipe(recipe, overrides or []), echo=typer.echo)
        for role, lineage in summary["roles"].items():
            typer.echo(f"{role}: {lineage['source_adapter'] or '(fresh LoRA)'} -> {lineage['rl_adapter']} "
                       f"(step {lineage['global_step']})")
