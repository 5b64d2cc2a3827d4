"""`astraflow run CONFIG`: every role of an experiment as its own process on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def run(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    bus: Annotated[str | None, typer.Option(
        help="embedded (default: a SQLite file in the run directory) or kafka://host:port")]
    = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/<run>).")]
    = None,
    live: Annotated[bool, typer.Option(help="Show the live view.")] = True,
    fresh: Annotated[bool, typer.Option(help="Delete the run directory first.")] = True,
) -> None:
    """Launch the producer, rollout workers, policy stages, trainer(s) and evaluator(s) as
    separate processes, supervise them, stop when the trainers reach their step budget (or on
    Ctrl-C), and leave the run directory: config, logs, metrics.jsonl, final weights, plots."""
    from astraflow.cli.common import fail, with_env_bus
    from astraflow.config import load_experiment
    from astraflow.core.errors import AstraflowError
    from astraflow.run.orchestrate import run_experiment

    sets = with_env_bus(overrides)
    if bus is not None and bus != "embedded":
        sets.append(f"bus.url={bus}")
    try:
        cfg = load_experiment(config, sets)
        code = run_experiment(cfg, out or Path("runs") / cfg.run, live=live, fresh=fresh)
    except AstraflowError as e:
        raise fail(str(e)) from None
    raise typer.Exit(code)
