"""The `astraflow` command. Heavy imports (torch, confluent_kafka) happen inside commands only,
so `astraflow --help` stays fast."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from astraflow.cli import (
    bench,
    broker,
    check,
    config_cmd,
    demo,
    evaluate,
    inspect_cmd,
    models,
    plugins,
    policy,
    produce,
    rollout,
    run,
    scale,
    serve,
    top,
    topics,
    train,
    weights,
)

app = typer.Typer(
    name="astraflow",
    help="AstraFlow: dataflow-oriented RL for LLM agents. Nobody is in charge: every role is "
         "a process on durable topics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(broker.app, name="broker")
app.add_typer(topics.app, name="topics")
app.add_typer(config_cmd.app, name="config")
app.add_typer(weights.app, name="weights")
app.add_typer(bench.app, name="bench")
app.add_typer(models.app, name="models")
app.command("inspect")(inspect_cmd.inspect)
app.command("check")(check.check)
app.command("run")(run.run)
app.command("produce")(produce.produce)
app.command("rollout")(rollout.rollout)
app.command("serve")(serve.serve)
app.command("policy")(policy.policy)
app.command("train")(train.train)
app.command("report")(scale.report)
app.command("scale")(scale.scale)
app.command("evaluate")(evaluate.evaluate)
app.command("top")(top.top)
app.command("demo")(demo.demo)
app.command("plugins")(plugins.plugins)


@app.command("demo-worker", hidden=True)
def demo_worker(url: str, run: str, worker_id: str, delay: float = 0.01) -> None:
    demo.worker(url, run, worker_id, delay)


@app.callback()
def _root(
    log_level: Annotated[str, typer.Option(
        envvar="ASTRAFLOW_LOG_LEVEL",
        help="Log level of the astraflow logger (every role of `astraflow run` inherits the "
             "environment variable).")] = "WARNING",
) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("astraflow").setLevel(log_level.upper())
    from astraflow.core.launcher import stop_when_orphaned

    stop_when_orphaned()  # a role of `astraflow run` ends with its launcher


def main() -> None:
    from astraflow.core.errors import AstraflowError

    try:
        app()
    except AstraflowError as e:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
