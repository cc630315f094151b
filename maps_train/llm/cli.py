"""`maps-train chat RECIPE --role ROLE "message"`: one call through the recipe's router, for a quick look."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("chat")
    def chat(
        recipe: str = typer.Argument(..., help="Recipe YAML (its roles and backend sections are used)."),
        message: str = typer.Argument(..., help="The user message."),
        role: str = typer.Option("default", "--role", help="Route the call as this role."),
        system: str = typer.Option(None, "--system", help="An optional system message."),
        max_tokens: int = typer.Option(None, "--max-tokens", help="Override the route's max_tokens."),
        schema: str = typer.Option(None, "--schema", help="A JSON schema file to constrain the output."),
        overrides: list[str] = typer.Option(  # noqa: B008 - typer's declaration style
            None, "--set", help="Dotted recipe overrides, e.g. backend.dtype=float32"
        ),
    ) -> None:
        """Send one message as ROLE; print the reply, any reasoning, and its cost."""
        from pathlib import Path

        from maps_train.errors import MapsTrainError
        from maps_train.llm import ChatRequest
        from maps_train.llm.router import build_router
        from maps_train.recipe import load_recipe

        json_schema = None
        if schema:
            try:
                json_schema = json.loads(Path(schema).read_text())
            except (OSError, ValueError) as err:
                raise MapsTrainError(f"--schema {schema}: {err}") from None
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
        router = build_router(load_recipe(recipe, overrides or []))
        try:
            (comp,) = router.generate(
                [ChatRequest(role=role, messages=messages, max_tokens=max_tokens, json_schema=json_schema)]
            )
        finally:
            router.close()
        if comp.reasoning:
            typer.echo(f"[reasoning] {comp.reasoning}")
        typer.echo(comp.text)
        typer.echo(
            f"[{comp.model}{' + ' + comp.adapter if comp.adapter else ''}] {comp.prompt_tokens} prompt + "
            f"{comp.completion_tokens} completion tokens, {comp.latency_s:.2f}s, finish={comp.finish_reason}",
            err=True,
        )
