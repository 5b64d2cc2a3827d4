"""``astraflow report CONFIG`` and ``astraflow scale CONFIG``: the reporter and the scaler as
processes of their own (docs/elastic.md). Under `astraflow run` with
``scale.enabled`` the reporter is one of the run's roles and the scaler runs in the launcher
itself, acting through its supervisor. Imports stay light (typer, stdlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption as OutOpt

ConfigArg = Annotated[Path, typer.Argument(help="Experiment YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Config override a.b=c "
                                                                "(repeatable).")]
TimeoutOpt = Annotated[float | None, typer.Option(help="Stop after this many seconds.")]


def report(config: ConfigArg, out: OutOpt = None, overrides: SetOpt = None,
           max_reports: Annotated[int | None, typer.Option(
               help="Write this many reports, then exit.")] = None,
           timeout: TimeoutOpt = None) -> None:
    """Run the reporter: read heartbeats on `metrics` and the run's lags, write a LoadReport
    to `reports` every scale.report_every_steps trainer steps (or scale.report_every_s
    seconds). SIGTERM/SIGINT: exit 0."""
    from astraflow.cli.common import load_role, role_run
    from astraflow.run.roles import run_configured_reporter

    cfg, out = load_role(config, overrides, out)
    with role_run() as should_stop:
        sent = run_configured_reporter(cfg, out, max_reports=max_reports, timeout=timeout,
                            should_stop=should_stop)
    typer.echo(f"reports={len(sent)}")


def scale(config: ConfigArg, out: OutOpt = None, overrides: SetOpt = None,
          max_reports: Annotated[int | None, typer.Option(
              help="Handle this many reports, then exit.")] = None,
          timeout: TimeoutOpt = None) -> None:
    """Run the scaler: read `reports`, decide each pool's size by the three-zone rule
    (scale.*), act through the pool's actuator (local: start/stop `astraflow rollout`
    processes here; command: a templated shell command). Every decision is logged to
    OUT/scaler.jsonl and the `metrics` topic. SIGTERM/SIGINT: stop the processes it started
    (they drain) and exit 0."""
    from astraflow.cli.common import load_role, role_run
    from astraflow.run.roles import run_configured_scaler

    cfg, out = load_role(config, overrides, out)
    with role_run() as should_stop:
        decisions = run_configured_scaler(cfg, config, out, max_reports=max_reports,
                                          timeout=timeout, should_stop=should_stop)
    acted = sum(1 for d in decisions if d["target"] != d["current"])
    typer.echo(f"decisions={len(decisions)} actions={acted}")
