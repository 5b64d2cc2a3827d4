"""`astraflow bench`: study a workload without the hardware it was recorded on.

``bench replay RUN_DIR`` replays a run's recorded generation lengths and tool/verifier waits
(or a ``--synthetic`` workload) through a simulated engine and trainer, synchronously and
asynchronously (docs/replay.md). The simulator loads inside the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from astraflow.cli.common import fail

app = typer.Typer(help="Replay recorded or synthetic workloads through a simulated engine.",
                  no_args_is_help=True)


@app.command()
def replay(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory made by `astraflow run` (holds bus.db).")] = None,
    synthetic: Annotated[str | None, typer.Option(
        help="Instead of a run: lognormal:p50=0.05,p99=2[,turns=2,tokens=64,tokens_p99=64,"
             "group=8,groups=64,seed=0] (waits in seconds).")] = None,
    run: Annotated[str | None, typer.Option(help="Run name, when bus.db holds several.")]
    = None,
    policy: Annotated[str | None, typer.Option(
        help="Replay only this policy's trajectories (default: every policy's).")] = None,
    batch_groups: Annotated[int | None, typer.Option(
        help="Groups per trainer step (default: the run's trainer log, else 8).")] = None,
    train_s: Annotated[float | None, typer.Option(
        help="Trainer seconds per step (default: the run's median step_s, else 1.0).")] = None,
    sync_s: Annotated[float, typer.Option(
        help="Seconds to publish weights after each step.")] = 0.0,
    staleness: Annotated[int, typer.Option(
        help="Asynchronous: versions rollout may run ahead of the trainer (>= 1).")] = 1,
    concurrency: Annotated[int, typer.Option(
        help="Episodes in flight at most (0: no limit).")] = 256,
    step_a: Annotated[float | None, typer.Option(
        help="Decode step seconds, fixed part (default: fitted to the run, else 0.015).")]
    = None,
    step_b: Annotated[float, typer.Option(
        help="Decode step seconds per episode in the batch.")] = 5e-5,
    steps: Annotated[int | None, typer.Option(
        help="Trainer steps to simulate (default: all whole steps of the workload).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
    = False,
) -> None:
    """Replay a workload synchronously and asynchronously: trainer wait ratio, effective
    samples/s, tail share (the slowest 10% of episodes' share of all episode time) and the
    async/sync speedup."""
    from astraflow.sim import ReplayError, SimConfig, compare
    from astraflow.sim import synthetic as draw
    from astraflow.sim.workload import describe

    if (run_dir is None) == (synthetic is None):
        raise fail("give a run directory or --synthetic SPEC (one of them)")
    try:
        if staleness < 1:
            raise ReplayError(f"--staleness {staleness}: must be >= 1 (0 is the synchronous "
                              "schedule, which is always reported)")
        if synthetic is not None:
            workload = draw(synthetic)
        else:
            from astraflow.sim.recorded import load_run

            assert run_dir is not None
            workload = load_run(run_dir, run=run, policy=policy)
        b = batch_groups or workload.batch_groups or 8
        a = step_a
        if a is None:
            a = 0.015
            if workload.sec_per_token:  # the recorded seconds per token, at ~full batch
                a = max(workload.sec_per_token - step_b * concurrency,
                        workload.sec_per_token / 10)
        cfg = SimConfig(step_a=a, step_b=step_b, concurrency=concurrency,
                        train_s=train_s if train_s is not None else workload.train_s or 1.0,
                        sync_s=sync_s, batch_groups=b, staleness=staleness, steps=steps)
        result = compare(workload, cfg)
    except ReplayError as e:
        raise fail(str(e)) from None
    settings = {k: getattr(cfg, k) for k in ("step_a", "step_b", "concurrency", "train_s",
                                             "sync_s", "batch_groups", "staleness", "steps")}
    settings["steps"] = result.sync.steps
    out = {"workload": {**describe(workload), "notes": workload.notes}, "settings": settings,
           **result.summary()}
    if as_json:
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    _table(out)


ROWS = (
    ("trainer wait ratio", "trainer_wait_ratio", "{:.3f}"),
    ("effective samples/s", "samples_per_s", "{:.2f}"),
    ("tail share (slowest 10%)", "tail_share", "{:.3f}"),
    ("wall s", "wall_s", "{:.1f}"),
    ("engine busy ratio", "engine_busy_ratio", "{:.3f}"),
    ("episode p50 / p99 s", None, ""),
    ("staleness mean / max", None, ""),
)


def _table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    w, s = out["workload"], out["settings"]
    console = Console()
    console.print(
        f"[bold]{escape(str(w['source']))}[/]: {w['groups']} groups, {w['episodes']} episodes, "
        f"{w['samples']} trajectories; {w['turns_per_episode']:.2f} turns/episode, tokens/turn "
        f"p50 {w['tokens_per_turn_p50']:g} p99 {w['tokens_per_turn_p99']:g}; wait/episode "
        f"p50 {w['wait_per_episode_p50_s']:.3g}s p99 {w['wait_per_episode_p99_s']:.3g}s",
        highlight=False)
    for note in w["notes"]:
        console.print(f"note: {escape(note)}", highlight=False)
    console.print(
        f"engine step = {s['step_a']:.4g} + {s['step_b']:.3g} x batch s, concurrency "
        f"{s['concurrency'] or 'unlimited'}; trainer {s['train_s']:.3g} s/step "
        f"(+{s['sync_s']:g} s sync) on {s['batch_groups']} groups, {s['steps']} steps",
        highlight=False)
    table = Table()
    table.add_column("metric")
    table.add_column("sync", justify="right")
    table.add_column(f"async (k={out['async']['staleness']})", justify="right")
    for label, key, fmt in ROWS:
        cells = []
        for r in (out["sync"], out["async"]):
            if key is not None:
                cells.append(fmt.format(r[key]))
            elif label.startswith("episode"):
                cells.append(f"{r['episode_p50_s']:.3g} / {r['episode_p99_s']:.3g}")
            else:
                cells.append(f"{r['staleness_mean']:.2f} / {r['staleness_max']}")
        table.add_row(label, *cells)
    console.print(table)
    console.print(f"async/sync speedup (effective samples/s): [bold]{out['speedup']:.2f}x[/]")
