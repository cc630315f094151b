"""`maps-train models ...`: materialise and locate builtin models."""

from __future__ import annotations

import time

import typer


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(help="Builtin models (offline) and model resolution.", no_args_is_help=True)
    app.add_typer(models_app, name="models")

    @models_app.command("resolve")
    def resolve(name: str = typer.Argument(..., help="builtin:NAME, a local folder or a hub id")) -> None:
        """Print the local path (materialising a builtin on first use)."""
        from maps_train.models import resolve_model

        start = time.perf_counter()
        path = resolve_model(name)
        typer.echo(f"{name} -> {path} ({time.perf_counter() - start:.1f}s)")

    @models_app.command("list")
    def list_builtins() -> None:
        """List the builtin models."""
        from maps_train.models import BUILTINS

        for name in BUILTINS:
            typer.echo(f"builtin:{name}")
