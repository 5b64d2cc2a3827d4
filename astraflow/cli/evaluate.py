"""`astraflow evaluate CONFIG --policy NAME | --team`: held-out greedy evaluation of every
weight version of one policy (answers, or a verifier's judgement), or of a solver_verifier team
as a whole (system accuracy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def evaluate(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    policy: Annotated[str | None, typer.Option(help="Policy (default: the first).")] = None,
    team: Annotated[bool, typer.Option(
        "--team", help="Evaluate the solver_verifier team as a whole (every policy).")]
    = False,
    out: OutOption = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
    max_evals: Annotated[int | None, typer.Option(help="Stop after N evaluations.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
    = None,
) -> None:
    """Follow weights.<policy> (with --team: of every team policy); for each version reached,
    decode the held-out problems greedily and report on the metrics topic (eval_accuracy;
    with --team system_accuracy). SIGTERM stops it."""
    from astraflow.cli.common import load_role, role_run
    from astraflow.core.errors import ConfigError
    from astraflow.core.metrics import MetricsEmitter, component_id
    from astraflow.run.resources import open_bus
    from astraflow.run.roles import configured_evaluator, configured_team_evaluator

    cfg, out = load_role(config, overrides, out)
    if team and policy is not None:
        raise ConfigError("give --policy NAME or --team, not both")
    name = "team" if team else policy or cfg.policies[0]
    with role_run() as should_stop:
        bus = open_bus(cfg, out)
        # unique per process: two evaluators of one policy must not share a label; the
        # team's has its own role, so a policy named "team" stays a policy
        role = "evaluator-team" if team else "evaluator"
        metrics = MetricsEmitter(bus, run=cfg.run, role=role,
                                 component=component_id(f"evaluator-{name}"))
        try:
            ev = (configured_team_evaluator(cfg, out, bus=bus, metrics=metrics) if team else
                  configured_evaluator(cfg, name, out, bus=bus, metrics=metrics))
            try:
                ev.run(max_evals=max_evals, timeout=timeout, should_stop=should_stop,
                       every=cfg.launch.eval_every)
            finally:
                ev.close()
        finally:
            metrics.close()
            bus.close()
    for r in ev.results:
        typer.echo(r.describe())
