"""`astraflow retrain RUN_DIR --set trainer.… --out NEW` and `astraflow compare RUN_A RUN_B`: a
counterfactual trainer on a run's recorded data, and the two side by side
(astraflow.run.retrain, astraflow.run.compare)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def retrain(
    run_dir: Annotated[Path, typer.Argument(help="The run directory whose data is reused.")],
    out: Annotated[Path, typer.Option("--out", help="A new directory for the counterfactual.")],
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="A trainer key to change, trainer.a.b=c (repeatable).")] = None,
    policy: Annotated[list[str] | None, typer.Option(
        "--policy", help="A policy to retrain (repeatable; default: every policy).")] = None,
) -> None:
    """Train a fresh trainer, with the trainer keys given by --set changed, on the batches the
    run trained (same trajectories, same order) and measure it on the run's held-out problems
    at every version the run's evaluator measured. Off-policy learning on a fixed dataset, not
    a new on-policy run. Then `astraflow compare RUN_DIR OUT`."""
    from astraflow.cli.common import fail
    from astraflow.run.replay import ReplayError
    from astraflow.run.retrain import retrain as run_retrain

    if not run_dir.is_dir():
        raise fail(f"{run_dir}: no such run directory", code=2)

    def progress(p: str, v: int, n: int) -> None:
        if sys.stderr.isatty() or v % 50 == 0 or v == n:
            print(f"retrain {p}: step {v}/{n}", file=sys.stderr, flush=True)

    try:
        for result in run_retrain(run_dir, list(overrides or []), out, policy or None,
                                  progress):
            print(result.line(), flush=True)
    except ReplayError as e:
        raise fail(str(e)) from None
    print(f"written to {out}: compare with `astraflow compare {run_dir} {out}`")


def compare(
    run_a: Annotated[Path, typer.Argument(help="A run (or retrain) directory.")],
    run_b: Annotated[Path, typer.Argument(help="Another one.")],
    png: Annotated[Path | None, typer.Option(
        "--png", help="Where to draw the picture (default: RUN_B/compare.png).")] = None,
) -> None:
    """Held-out accuracy at every step both measured and the train metrics' means, as a
    markdown table; both curves in one picture."""
    from astraflow.cli.common import fail
    from astraflow.core.errors import AstraflowError
    from astraflow.run.compare import compare as run_compare

    try:
        text, path = run_compare(run_a, run_b, png or run_b / "compare.png")
    except AstraflowError as e:
        raise fail(str(e)) from None
    print(text)
    print(f"picture: {path}")
