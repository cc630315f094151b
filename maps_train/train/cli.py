"""`maps-train train RECIPE` (one `accelerate launch` per adapter) and `maps-train adapters check DIR...`."""

from __future__ import annotations

import typer

from maps_train.preflight_hook import no_plan_option, preflight


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        recipe: str = typer.Argument(..., help="A recipe YAML (recipes/distill/*.yaml)."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.max_steps=100"),
        role: str = typer.Option("all", "--role", help="An adapter name, 'shared', or 'all'."),
        accelerate_config: str = typer.Option(
            None, "--accelerate-config", help="recipes/accelerate/*.yaml (default: train.accelerate_config)."
        ),
        num_processes: int = typer.Option(
            None, "--num-processes",
            help="Ranks to start. Default: an accelerate config's num_processes, else one per visible GPU (the GPU "
                 "configs set none); with no config, train.num_processes.",
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite",
            help="Retrain finished adapters (removes only folders training wrote: marked .written-by-maps-train).",
        ),
        num_machines: int = typer.Option(
            None, "--num-machines", help="Machines in the job (default: the accelerate config's, else 1); run the "
                                         "same command on each with its own --machine-rank."),
        machine_rank: int = typer.Option(
            None, "--machine-rank", help="This machine's rank, 0 on the main one (default: the config's, else 0)."),
        main_process_ip: str = typer.Option(
            None, "--main-process-ip", help="The main machine's address (default: the config's main_process_ip)."),
        main_process_port: int = typer.Option(
            None, "--main-process-port",
            help="The main machine's port, the same on every machine (default: the config's main_process_port; "
                 "one machine without either: a free port)."),
        no_plan: bool = no_plan_option(),
    ) -> None:
        """LoRA SFT of the student: each adapter in its own `accelerate launch -m maps_train.train`, or all of
        them in one launch (train.one_launch); an adapter with no SFT rows is recorded, not trained."""
        preflight("train", recipe, overrides, skip=no_plan, accelerate_config=accelerate_config,
                  num_machines=num_machines)
        from maps_train.adapters.set import learned_nothing
        from maps_train.train.adapter_check import check_adapter
        from maps_train.train.launch import Machines, train_all

        machines = Machines(num_machines, machine_rank, main_process_ip, main_process_port)
        folders = train_all(
            recipe, role, overrides or [], accelerate_config, num_processes, overwrite, echo=typer.echo,
            machines=machines,
        )
        if machine_rank:
            typer.echo(f"machine {machine_rank}: done; the adapters are written by machine 0")
            return
        for folder in folders:
            if learned_nothing(folder):
                typer.echo(f"{folder}: learned nothing (no SFT rows): the base model serves its roles")
                continue
            problems = check_adapter(folder)
            typer.echo(f"{folder}: {'ok' if not problems else '; '.join(problems)}")

    adapters_app = typer.Typer(help="Trained LoRA adapters.", no_args_is_help=True)
    app.add_typer(adapters_app, name="adapters")

    @adapters_app.command("check")
    def check(
        folders: list[str] = typer.Argument(..., help="Adapter folders."),
        base_model: str = typer.Option(None, "--base-model", help="Also compare layer sizes with this model."),
    ) -> None:
        """Check that adapters are ones vLLM multi-LoRA serves (rank, modules, no vocab changes, no tokenizer); a
        folder whose record says it learned nothing is no adapter to serve (exit 1)."""
        from maps_train.adapters.set import learned_nothing
        from maps_train.train.adapter_check import check_adapter

        failed = 0
        for folder in folders:
            if learned_nothing(folder):  # its record says so: serve, eval and RL ignore whatever weights it holds
                failed += 1
                typer.echo(f"{folder}: learned nothing (its train_summary.json: no SFT rows): no adapter to serve; "
                           "the base model serves its roles")
                continue
            problems = check_adapter(folder, base_model)
            if problems:
                failed += 1
                typer.echo(f"{folder}: {len(problems)} problem(s)")
                for problem in problems:
                    typer.echo(f"  - {problem}")
            else:
                typer.echo(f"{folder}: ok")
        if failed:
            raise typer.Exit(1)
