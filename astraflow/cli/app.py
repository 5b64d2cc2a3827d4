"""The `astraflow` command. Heavy imports (torch, confluent_kafka) happen inside commands only,
so `astraflow --help` stays fast."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any

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
    replay,
    retrain,
    rollout,
    run,
    scale,
    serve,
    top,
    topics,
    train,
    weights,
)

#: `-h` is `--help` on every command (click passes it down to each subcommand's context)
CONTEXT = {"help_option_names": ["-h", "--help"]}

#: the help panels of `astraflow --help`
RUN, ROLES, DATA, OPS, BENCH = "Run", "Roles", "Data & weights", "Operations", "Benchmarks"

app = typer.Typer(
    name="astraflow",
    help="AstraFlow: dataflow-oriented RL for LLM agents. Nobody is in charge: every role is "
         "a process on durable topics.",
    epilog="Exit codes: 0 ok; 1 a run or config error; 2 a usage error; 3 `run`: a role "
           "failed for good (exhausted launch.max_restarts). Docs: docs/cli.md.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
)

#: (name, module function, panel, one-line help)
COMMANDS: list[tuple[str, Callable[..., Any], str, str]] = [
    ("run", run.run, RUN, "Run an experiment: every role as a process on this host."),
    ("check", check.check, RUN, "Check a config (models, data, reward, memory); start nothing."),
    ("demo", demo.demo, RUN, "Show the bus at work: workers join, die and leave, no model."),
    ("replay", replay.replay, RUN, "Re-train a run from its log; check every version bit for "
                                   "bit."),
    ("retrain", retrain.retrain, RUN, "Train a counterfactual trainer on a run's recorded data."),
    ("compare", retrain.compare, RUN, "Two runs' held-out curves and train metrics side by "
                                      "side."),
    ("produce", produce.produce, ROLES, "Run the producer: the dataset's tasks to the bus."),
    ("rollout", rollout.rollout, ROLES, "Run a rollout worker: tasks in, trajectories out."),
    ("serve", serve.serve, ROLES, "Serve the OpenAI-compatible gateway for SDK agents."),
    ("policy", policy.policy, ROLES, "Run a data-policy stage (pre_rollout, post_rollout, "
                                     "batch)."),
    ("train", train.train, ROLES, "Run one policy's trainer: batches in, weights out."),
    ("evaluate", evaluate.evaluate, ROLES, "Run a held-out evaluator of a policy or team."),
    ("report", scale.report, ROLES, "Run the load reporter of the elastic scaler."),
    ("scale", scale.scale, ROLES, "Run the elastic scaler as a process of its own."),
    ("inspect", inspect_cmd.inspect, DATA, "Print a topic's records as JSON lines."),
    ("top", top.top, OPS, "The live view of a running experiment."),
    ("plugins", plugins.plugins, OPS, "List every registered name and where it comes from."),
]
for _name, _fn, _panel, _short in COMMANDS:
    app.command(_name, rich_help_panel=_panel, short_help=_short)(_fn)

#: (name, sub-app, panel, one-line help)
GROUPS = [
    ("topics", topics.app, DATA, "Create, list and describe topics."),
    ("weights", weights.app, DATA, "Weight deltas: diff, apply, inspect, serve, mirror."),
    ("models", models.app, DATA, "Import a gguf file, a hub id or a shortcut as a model."),
    ("config", config_cmd.app, OPS, "Show a resolved config; print the config reference."),
    ("broker", broker.app, OPS, "Start, stop and inspect a local Kafka broker."),
    ("bench", bench.app, BENCH, "Replay workloads through a simulated engine."),
]
for _name, _sub, _panel, _short in GROUPS:
    app.add_typer(_sub, name=_name, rich_help_panel=_panel, short_help=_short)


@app.command("demo-worker", hidden=True)
def demo_worker(url: str, run: str, worker_id: str, delay: float = 0.01) -> None:
    demo.worker(url, run, worker_id, delay)


def _version(value: bool) -> None:
    """``--version``: parsed before the command is looked for, so it needs none."""
    if value:
        from astraflow import __version__

        typer.echo(f"astraflow {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version,
        help="Print the version and exit.")] = False,
    log_level: Annotated[str, typer.Option(
        envvar="ASTRAFLOW_LOG_LEVEL",
        help="Log level of the astraflow logger (every role of `astraflow run` inherits the "
             "environment variable).")] = "WARNING",
) -> None:
    from astraflow.core.redact import redact_log_handlers

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("astraflow").setLevel(log_level.upper())
    redact_log_handlers()  # no token, password or key reaches a log line
    from astraflow.core.launcher import stop_when_orphaned

    stop_when_orphaned()  # a role of `astraflow run` ends with its launcher


def main() -> None:
    from astraflow.core.errors import AstraflowError

    try:
        app()
    except AstraflowError as e:
        from astraflow.cli.common import report_line

        report_line(str(e))
        sys.exit(1)


if __name__ == "__main__":
    main()
