"""`astraflow replay RUN_DIR`: re-train a finished (or stopped) run from its log and check every
weight version it published, bit for bit (astraflow.run.replay)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def replay(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (`astraflow run --out`).")],
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", help="A policy to replay (repeatable; default: every policy).")] = None,
) -> None:
    """Build a fresh trainer per policy from the run's config and starting weights, train it
    on the batches the run's trainer trained, in its order (from its JSON log and the bus),
    and compare each version with the digests the run published. Prints "N versions
    reproduced bit for bit" per policy, or the first version and tensor that differ (exit 1)."""
    from astraflow.cli.common import fail
    from astraflow.run.replay import ReplayError
    from astraflow.run.replay import replay as run_replay

    if not run_dir.is_dir():
        raise fail(f"{run_dir}: no such run directory", code=2)

    def progress(p: str, v: int, n: int) -> None:
        if sys.stderr.isatty() or v % 50 == 0 or v == n:
            print(f"replay {p}: step {v}/{n}", file=sys.stderr, flush=True)

    ok = True
    try:
        for result in run_replay(run_dir, policy or None, progress):
            print(result.line(), flush=True)
            ok = ok and result.ok
    except ReplayError as e:
        raise fail(str(e)) from None
    raise typer.Exit(0 if ok else 1)
