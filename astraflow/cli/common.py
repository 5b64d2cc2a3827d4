"""Shared CLI plumbing: the --bus option, error reporting, consoles. Imports stay light."""

from __future__ import annotations

import os
from typing import Annotated

import typer

DEFAULT_BUS = "embedded://.astraflow/bus.db"

BusOption = Annotated[
    str,
    typer.Option("--bus", envvar="ASTRAFLOW_BUS",
                 help="Bus URL: embedded:///path/bus.db (default: ./.astraflow/bus.db) or "
                      "kafka://host:port[,host:port]."),
]


def default_bus() -> str:
    return os.environ.get("ASTRAFLOW_BUS", DEFAULT_BUS)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error a person can act on (no traceback) and return the Exit to raise."""
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)
