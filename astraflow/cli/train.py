"""``astraflow train CONFIG --policy NAME``: run the trainer of one policy.

Mounted in the main app as ``app.command("train")(train.train)``; also runnable alone:
``python -m astraflow.cli.train CONFIG --policy NAME``. Imports stay light (typer, stdlib):
torch loads inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from astraflow.cli.common import OutOption

if TYPE_CHECKING:
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.sharded import ShardedPublisher


def train(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    policy: Annotated[str | None, typer.Option(
        "--policy", help="The policy to train (default: the first of `policies`).")] = None,
    out: OutOption = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Config override a.b=c (repeatable), e.g. trainer.optimizer.lr=1e-4.")]
    = None,
    max_steps: Annotated[int | None, typer.Option(
        help="Stop at this version (overrides trainer.max_steps; a restarted trainer "
             "finishes the same total).")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
    = None,
    publish: Annotated[bool, typer.Option(
        help="Publish weights to weights.<policy> (--no-publish: checkpoints only).")] = True,
) -> None:
    """Consume batches.<policy>, step the optimizer, publish weights, checkpoint. SIGTERM or
    Ctrl-C finish the current step, checkpoint, commit and exit 0."""
    import logging

    from astraflow.cli.common import load_role, role_run
    from astraflow.run.resources import open_bus

    cfg, out = load_role(config, overrides, out)
    name = policy or cfg.policies[0]
    if max_steps is not None:
        cfg.trainer.max_steps = max_steps
    trainer = metrics = None
    publisher: Publisher | ShardedPublisher | None = None
    bus = None
    with role_run() as should_stop:
        try:
            from astraflow.core.metrics import MetricsEmitter, component_id
            from astraflow.run.roles import (
                configured_publisher,
                configured_rank_publisher,
                configured_trainer,
            )

            out.mkdir(parents=True, exist_ok=True)
            bus = open_bus(cfg, out)
            trainer = configured_trainer(cfg, name, out, bus=bus)
            state = trainer.state
            # fsdp: every rank publishes its own rows; a LoRA adapter (a few MB) is gathered
            # and published whole by rank 0
            if publish and state.parallel == "fsdp" and state.adapter is None:
                trainer.publisher = publisher = configured_rank_publisher(
                    cfg, name, out, bus, rank=state.rank, world=state.world)
            if state.rank == 0:  # data parallel: rank 0 alone talks to the bus
                if publish and publisher is None:
                    trainer.publisher = publisher = configured_publisher(cfg, name, out, bus)
                    publisher.adapter = state.adapter  # LoRA: manifests name the base
                # the component names the policy: a run's lines tell its trainers apart
                trainer.metrics = metrics = MetricsEmitter(
                    bus, run=cfg.run, role="trainer", component=component_id(f"trainer-{name}"),
                    interval=cfg.trainer_for(name).metrics_interval_s)
            stats = trainer.run(timeout=timeout, should_stop=should_stop)
        finally:
            if trainer is not None:
                trainer.close()
            if publisher is not None:
                publisher.close()
            if metrics is not None:
                metrics.close()
            if bus is not None:
                bus.close()
    logging.getLogger("astraflow.trainer").info("policy=%s done", name)
    typer.echo(f"policy={name} version={stats.version} steps={stats.steps} "
               f"duplicates={stats.duplicates} dead_lettered={stats.dead_lettered} "
               f"wait_s={stats.wait_s:.2f} busy_s={stats.busy_s:.2f}")


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train)
    app()


if __name__ == "__main__":
    main()
