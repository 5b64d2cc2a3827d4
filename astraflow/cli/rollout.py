"""``astraflow rollout CONFIG``: run one rollout worker (docs/rollout.md).

Mounted in the main app as ``app.command("rollout")(rollout.rollout)``; also runnable alone:
``python -m astraflow.cli.rollout CONFIG``. Imports stay light (typer, stdlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def rollout(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    out: OutOption = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Config override a.b=c (repeatable).")] = None,
    max_tasks: Annotated[int | None, typer.Option(
        help="Take this many tasks, finish them, then exit.")] = None,
    timeout: Annotated[float | None, typer.Option(
        help="Stop taking tasks after this many seconds, drain, exit.")] = None,
    worker_id: Annotated[str | None, typer.Option(
        help="Component id in metrics and trajectories (default: rollout-<host>-<pid>-<hex>).")]
    = None,
) -> None:
    """Run a rollout worker: join the `rollout` group on `tasks`, run episodes, produce
    trajectories. SIGTERM/SIGINT: stop taking tasks, finish or release in-flight ones, commit,
    leave the group, exit 0."""
    from astraflow.cli.common import load_role, role_run
    from astraflow.run.roles import run_configured_worker

    cfg, out = load_role(config, overrides, out)
    with role_run() as should_stop:
        stats = run_configured_worker(cfg, out, max_tasks=max_tasks, timeout=timeout,
                           should_stop=should_stop, worker_id=worker_id)
    typer.echo(" ".join(f"{k}={v}" for k, v in stats.as_dict().items()))


def main() -> None:
    import logging
    import os

    from astraflow.core.redact import redact_log_handlers

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("astraflow").setLevel(os.environ.get("ASTRAFLOW_LOG_LEVEL", "WARNING"))
    redact_log_handlers()  # no token, password or key reaches a log line
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(rollout)
    app()


if __name__ == "__main__":
    main()
