"""`astraflow top`: the live view of any running experiment, from its metrics topic."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def top(
    config: Annotated[Path | None, typer.Argument(help="Experiment YAML (for run and bus).")]
    = None,
    out: OutOption = None,
    bus: Annotated[str | None, typer.Option(help="Bus URL (overrides the config's).")] = None,
    run: Annotated[str | None, typer.Option(help="Run name (overrides the config's).")] = None,
    once: Annotated[bool, typer.Option(help="Print one snapshot and exit.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override a.b=c.")]
    = None,
) -> None:
    """Per-role status, every policy's trainer step and version, reward and held-out
    evaluation (a verifier's judgement; a team's system accuracy), throughput, wait ratio, bus
    lag — read from the run's metrics topic; works against any running experiment."""
    from rich.console import Console
    from rich.live import Live

    from astraflow.cli.common import embedded_bus_file, fail, run_dir, with_env_bus
    from astraflow.config import load_experiment
    from astraflow.run.collector import Collector
    from astraflow.run.lag import run_lags
    from astraflow.run.resources import open_bus
    from astraflow.run.view import render

    overrides = with_env_bus(set_)
    if bus:
        overrides.append(f"bus.url={bus}")
    if run:
        overrides.append(f"run={run}")
    cfg = load_experiment(config, overrides)
    out = run_dir(cfg, out)
    file = embedded_bus_file(cfg, out)
    if file is not None and not file.exists():  # a viewer creates nothing, a bus least of all
        raise fail(f"no bus in the run directory {out} ({file} does not exist): give the "
                   "directory of a run with --out DIR (default: runs/<run>)")
    b = open_bus(cfg, out, create_topics=False)  # a viewer creates nothing
    collector = Collector(b, cfg.run, policies=cfg.policies)
    console = Console()
    try:
        if once:
            collector.catch_up()  # the whole history (a live run never stops adding to it)
            console.print(render(collector, lags=run_lags(b, cfg), title=cfg.run))
            return
        with Live(render(collector, title=cfg.run), console=console, refresh_per_second=2) as live:
            while True:
                while collector.poll(0.5) >= 1000:  # catching up on history: keep reading
                    pass
                live.update(render(collector, lags=run_lags(b, cfg), title=cfg.run))
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
        b.close()
