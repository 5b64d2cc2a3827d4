"""Shared CLI plumbing: the --bus option, error reporting, consoles. Imports stay light."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from astraflow.core.bus.url import DEFAULT_OUT, default_url

#: the --bus default: the one default bus URL (core's), in ./.astraflow
DEFAULT_BUS = default_url(DEFAULT_OUT)
BUS_ENV = "ASTRAFLOW_BUS"

BusOption = Annotated[
    str,
    typer.Option("--bus", envvar=BUS_ENV,
                 help="Bus URL: embedded:///path/bus.db (default: ./.astraflow/bus.db) or "
                      "kafka://host:port[,host:port]."),
]


def with_env_bus(overrides: list[str] | None) -> list[str]:
    """``--set`` overrides with ``ASTRAFLOW_BUS`` (when set) as the first: every command that
    reads an experiment config takes its bus from the environment like the commands with
    ``--bus`` do; an explicit ``--set bus.url=...`` or ``--bus`` still wins."""
    sets = list(overrides or [])
    url = os.environ.get(BUS_ENV)
    return [f"bus.url={url}", *sets] if url else sets


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
        return load_experiment(path, with_env_bus(overrides))
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
