"""Shared CLI plumbing: the --bus option, error reporting, consoles. Imports stay light."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Annotated, Any

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


def load_config(path: Any, overrides: list[str] | None) -> Any:
    """The experiment config at ``path`` with ``--set`` overrides; a ConfigError becomes a
    one-line error and exit code 1."""
    from astraflow.config import load_experiment
    from astraflow.core.errors import ConfigError

    try:
        return load_experiment(path, overrides or [])
    except ConfigError as e:
        raise fail(str(e)) from None


@contextlib.contextmanager
def role_run() -> Iterator[Callable[[], bool]]:
    """The body of a long-running role: yields ``should_stop``, which turns true on SIGTERM
    or SIGINT (the role then drains instead of dying); an AstraflowError becomes a one-line
    error and exit code 1; the previous signal handlers are restored on the way out."""
    from astraflow.core.errors import AstraflowError

    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield lambda: stop
    except AstraflowError as e:
        raise fail(str(e)) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
