"""``astraflow policy CONFIG STAGE``: run one data-algorithm stage processor.

Mounted in the main app as ``app.command("policy")(policy.policy)``; also runnable alone:
``python -m astraflow.cli.policy CONFIG STAGE``. Imports stay light (typer, stdlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption

STAGES = ("pre_rollout", "post_rollout", "batch")


def policy(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    stage: Annotated[str, typer.Argument(
        help="pre_rollout (tasks.raw -> tasks), post_rollout (trajectories -> "
             "groups.<policy>) or batch (groups.<policy> -> batches.<policy>).")],
    policy_name: Annotated[str | None, typer.Option(
        "--policy", help="batch stage: the policy to batch for (default: the primary).")]
    = None,
    out: OutOption = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Config override a.b=c (repeatable).")] = None,
    max_records: Annotated[int | None, typer.Option(
        help="Stop after this many input records.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
    = None,
) -> None:
    """Run one policy stage: consume, apply its chain of policies, produce, checkpoint and
    commit, until stopped (SIGTERM/SIGINT finish the current cycle first)."""
    from astraflow.cli.common import fail, load_role, role_run
    from astraflow.run.roles import run_configured_stage

    if stage not in STAGES:
        raise fail(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    cfg, out = load_role(config, overrides, out)
    with role_run() as should_stop:
        counters = run_configured_stage(cfg, stage, policy=policy_name, out=out,
                             max_records=max_records, timeout=timeout,
                             should_stop=should_stop)
    typer.echo(" ".join(f"{k}={v:g}" for k, v in counters.items()))


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(policy)
    app()


if __name__ == "__main__":
    main()
