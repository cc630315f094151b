"""The `maps-train` command: a thin layer over functions the tests call directly.

Each stage package that has commands ships a `cli.py` with `register(app)`; only packages that provide one
appear in `--help`. A command that starts engines or ranks (traces, train, serve, eval, rl) checks its own
stage's memory plan first, in its own body (`plan.preflight.preflight`, installed in `preflight_hook` here). Every `MapsTrainError`, and every
OSError (as its path and reason), is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from maps_train.config.redaction import install_log_redaction, redact_text
from maps_train.errors import MapsTrainError, os_error_line
from maps_train.plan.preflight import preflight
from maps_train.platform import apply_runtime_defaults, exit_cleanly_on_sigterm
from maps_train.preflight_hook import install as install_preflight

app = typer.Typer(
    name="maps-train",
    help="Distil the MAPS multi-hop retrieval agent into per-role LoRA adapters, serve and evaluate it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

config_app = typer.Typer(help="Inspect recipes.", no_args_is_help=True)
app.add_typer(config_app, name="config")

# Stage packages whose cli.py registers commands, in the order they appear in --help.
COMMAND_MODULES = (
    "maps_train.models.cli",
    "maps_train.retrieval.cli",
    "maps_train.llm.cli",
    "maps_train.agents.cli",
    "maps_train.traces.cli",
    "maps_train.train.cli",
    "maps_train.serve.cli",
    "maps_train.evaluate.cli",
    "maps_train.analysis.cli",
    "maps_train.distill.cli",
    "maps_train.rl.cli",
    "maps_train.demo",
    "maps_train.plan.cli",
    "maps_train.study.run",
)


@config_app.command("show")
def config_show(
    recipe: str = typer.Argument(None, help="A recipe YAML file (defaults when omitted)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. agent.num_directions=4"),
    explain: bool = typer.Option(False, "--explain", help="Each field's type, default, value, source file and "
                                 "description, section by section, with the stages that read it."),
    section: str = typer.Option(None, "--section", help="With --explain: only this section (e.g. agent)."),
) -> None:
    """Print the resolved recipe: file values, overrides and defaults (secrets such as backend.api_key as ***)."""
    from maps_train.config.explain import explain_rows, format_rows, redacted
    from maps_train.config.overlays import load_config_with_sources
    from maps_train.config.redaction import redact_secrets
    from maps_train.config.yaml_io import dump_yaml
    from maps_train.recipe import Recipe

    loaded, sources = load_config_with_sources(Recipe, recipe, overrides or [])
    # printed output ends up in terminals, logs and bug reports: never echo a key
    if explain:
        typer.echo(redact_text(format_rows(redacted(explain_rows(loaded, sources)), section)), nl=False)
    else:
        typer.echo(dump_yaml(redact_secrets(loaded)), nl=False)


def _register_all() -> None:
    install_preflight(preflight)  # the stage commands sit below `plan`: they call it through `preflight_hook`
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()


def main() -> None:
    apply_runtime_defaults()
    exit_cleanly_on_sigterm()  # `kill PID` stops a run's engine processes with it
    install_log_redaction()  # a server URL's password never reaches a log line
    try:
        app()
    except MapsTrainError as err:  # every error line redacted too: a URL's user info, a secret flag's value
        typer.echo(f"maps-train: error: {redact_text(str(err))}", err=True)
        sys.exit(2)
    except OSError as err:  # a full disk, EIO, a folder or a symlink loop where a file should be: the path, one line
        typer.echo(f"maps-train: error: {redact_text(os_error_line(err))}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
