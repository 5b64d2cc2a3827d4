"""`astraflow config show|reference`: the resolved config, and the generated reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.config_reference import reference_markdown

app = typer.Typer(help="Show a resolved experiment config; print the configuration reference.",
                  no_args_is_help=True)


@app.command()
def show(
    config: Annotated[Path | None, typer.Argument(help="Experiment YAML (none: defaults).")]
    = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
) -> None:
    """Print the config with every default filled in and overrides applied (as YAML)."""
    from astraflow.cli.common import fail, with_env_bus
    from astraflow.config import load_experiment
    from astraflow.core.config import dump
    from astraflow.core.errors import ConfigError

    try:
        cfg = load_experiment(config, with_env_bus(overrides))
    except ConfigError as e:
        raise fail(str(e)) from None
    typer.echo(dump(cfg), nl=False)


@app.command()
def reference() -> None:
    """Print the configuration reference (Markdown) generated from the config models."""
    typer.echo(reference_markdown(), nl=False)
