"""`maps-train serve RECIPE`: the student base with one LoRA adapter per role behind one vLLM server."""

from __future__ import annotations

import signal
import time

import typer

from maps_train.preflight_hook import no_plan_option, preflight


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        recipe: str = typer.Argument(..., help="The distillation recipe (train.student, train.output_dir, serve.*)."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. serve.port=8100"),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the exact vllm command and routing; start nothing."),
        log: str = typer.Option(None, help="Append the server's output to this file."),
        adapters_later: bool = typer.Option(
            False, "--adapters-later",
            help="Start before the adapters exist (LoRA slots, runtime loading on); `maps-train load-adapters` "
                 "loads them once trained."),
        adapters: str = typer.Option(
            None, "--adapters",
            help="An adapter set (a folder with adapters.json: what train, rl or distill-on-policy wrote); default: "
                 "serve.adapters_dir, else train.output_dir."),
        no_plan: bool = no_plan_option(),
    ) -> None:
        """Start `vllm serve` with the role adapters, wait until healthy, print the routing; Ctrl-C stops it."""
        preflight("serve", recipe, overrides, skip=no_plan)
        from maps_train.adapters import distilled_set, load_set
        from maps_train.config.redaction import redact_secrets
        from maps_train.config.yaml_io import dump_yaml
        from maps_train.errors import MapsTrainError
        from maps_train.recipe import load_recipe
        from maps_train.serve.plan import plan_server
        from maps_train.serve.server import VLLMServer

        loaded = load_recipe(recipe, overrides or [])
        adapter_set = load_set(adapters, loaded) if adapters else distilled_set(loaded)
        plan = plan_server(loaded, adapter_set, adapters_later=adapters_later)
        # printed output ends up in terminals, logs (the demo's serve.log) and bug reports: never echo a key
        typer.echo("command: " + plan.shown_command())
        typer.echo("memory: " + plan.memory)
        routing = dump_yaml(redact_secrets({"backend": {"base_urls": [plan.url]}, "roles": plan.routes}))
        if dry_run:
            typer.echo("# routing for the agent (paste into a recipe):\n" + routing)
            return
        # `kill PID` (SIGTERM) stops the server as cleanly as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        server = VLLMServer(plan, log_path=log, timeout_s=loaded.serve.startup_timeout_s)
        try:
            with server:
                typer.echo(f"healthy at {plan.url}\n# routing for the agent (paste into a recipe):\n" + routing)
                while server.process is not None and server.process.poll() is None:
                    time.sleep(1.0)
        except KeyboardInterrupt:
            typer.echo("stopped vllm serve")
            return
        raise MapsTrainError(f"vllm serve exited on its own with code {server.process.returncode} (see --log)")


    @app.command("load-adapters")
    def load_adapters(
        recipe: str = typer.Argument(..., help="The distillation recipe whose trained adapters to load."),
        overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. serve.port=8100"),
        url: str = typer.Option(None, help="The server's /v1 URL (default: the recipe's serve host and port)."),
        adapters: str = typer.Option(
            None, "--adapters", help="An adapter set (default: serve.adapters_dir, else train.output_dir)."),
    ) -> None:
        """Load the recipe's trained role adapters into a running `maps-train serve --adapters-later` server."""
        from maps_train.adapters import distilled_set, load_set
        from maps_train.recipe import load_recipe
        from maps_train.serve.load import load_adapters as load

        loaded = load_recipe(recipe, overrides or [])
        adapter_set = load_set(adapters, loaded) if adapters else distilled_set(loaded)
        load(loaded, url=url, echo=typer.echo, adapter_set=adapter_set)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
