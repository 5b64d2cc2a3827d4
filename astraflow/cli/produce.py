"""``astraflow produce CONFIG``: produce the experiment's tasks (docs/rollout.md).

Mounted in the main app as ``app.command("produce")(produce.produce)``; also runnable alone:
``python -m astraflow.cli.produce CONFIG``. Imports stay light (typer, stdlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def produce(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    out: OutOption = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Config override a.b=c (repeatable).")] = None,
    max_tasks: Annotated[int | None, typer.Option(help="Produce at most this many tasks.")]
    = None,
) -> None:
    """Read the configured dataset (JSONL, Parquet, or synthetic arithmetic) and produce one
    Task per row to `tasks.raw` (or `tasks`), n samples per task, one group id per (task,
    attempt). Re-running skips groups already on the topic."""
    from astraflow.cli.common import load_role, role_run
    from astraflow.run.roles import run_configured_producer as run_produce

    cfg, out = load_role(config, overrides, out)
    with role_run() as should_stop:
        stats = run_produce(cfg, out, max_tasks=max_tasks, should_stop=should_stop)
    typer.echo(f"produced={stats.produced} skipped={stats.skipped} "
               f"topic={cfg.producer.topic} seconds={stats.seconds:.2f}")


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(produce)
    app()


if __name__ == "__main__":
    main()
