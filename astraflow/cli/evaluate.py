"""`astraflow evaluate CONFIG --policy NAME`: held-out greedy accuracy of every weight version."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def evaluate(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    policy: Annotated[str | None, typer.Option(help="Policy (default: the first).")] = None,
    out: Annotated[Path, typer.Option(help="Run directory ({out} in the config).")]
    = Path("."),
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
    max_evals: Annotated[int | None, typer.Option(help="Stop after N evaluations.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
    = None,
) -> None:
    """Follow weights.<policy>; for each version reached, decode the held-out problems
    greedily and report eval_accuracy on the metrics topic. SIGTERM stops it."""
    from astraflow.cli.common import load_config, role_run
    from astraflow.config import open_bus
    from astraflow.core.metrics import MetricsEmitter, component_id
    from astraflow.run.roles import build_evaluator

    cfg = load_config(config, overrides)
    name = policy or cfg.policies[0]
    with role_run() as should_stop:
        bus = open_bus(cfg, out)
        # unique per process: two evaluators of one policy must not share a label
        metrics = MetricsEmitter(bus, run=cfg.run, role="evaluator",
                                 component=component_id(f"evaluator-{name}"))
        try:
            ev = build_evaluator(cfg, name, out, bus=bus, metrics=metrics)
            try:
                ev.run(max_evals=max_evals, timeout=timeout, should_stop=should_stop,
                       every=cfg.launch.eval_every)
            finally:
                ev.syncer.close()
        finally:
            metrics.close()
            bus.close()
    for r in ev.results:
        typer.echo(f"version {r.version}: accuracy {r.accuracy:.4f} ({r.n} problems, "
                   f"{r.seconds:.1f}s)")
