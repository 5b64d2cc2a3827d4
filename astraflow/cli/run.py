"""`astraflow run CONFIG`: every role of an experiment as its own process on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def refuse_foreign_dir(out: Path) -> None:
    """Refuse an ``out`` that exists, is not empty and is no run directory (no config.yaml)
    before anything else is said of it: neither --fresh (which never deletes a directory
    AstraFlow did not make) nor --resume can use it, so neither is suggested."""
    from astraflow.cli.common import fail

    if out.is_dir() and any(out.iterdir()) and not (out / "config.yaml").exists():
        raise fail(f"{out} exists and is not an AstraFlow run directory (no config.yaml): "
                   "nothing was started. A run needs a new or empty directory, or its own "
                   "(--fresh and --resume take only a run directory; a directory AstraFlow did "
                   "not make is never deleted): give another --out, e.g. --out runs/NAME")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} is a file, not a directory: give another --out")


def run(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    bus: Annotated[str | None, typer.Option(
        help="embedded (default: a SQLite file in the run directory) or kafka://host:port")]
    = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
    out: OutOption = None,
    live: Annotated[bool, typer.Option(
        help="Show the live view (on a terminal; --no-live, or stdout not a terminal: a plain "
             "progress line every launch.progress_every_s instead).")] = True,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress lines (the live view, errors and the end table "
                              "still show).")] = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="Delete an existing run directory first (never done unasked).")]
    = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run in an existing run directory: its topics and "
                         "offsets, its finished warm-up, each trainer's newest checkpoint.")]
    = False,
    warm: Annotated[Path | None, typer.Option(
        help="Start RL from the models of this run directory (one whose warm-up ended: "
             "--warmup-only or a whole run), skipping the warm-up.")] = None,
    warmup_only: Annotated[bool, typer.Option(
        "--warmup-only", help="Run the SFT warm-up alone and stop; start RL from it later "
                              "with --warm.")] = False,
    check: Annotated[bool, typer.Option(
        help="Check the config first (`astraflow check`) and start nothing if it fails.")]
    = True,
) -> None:
    """Launch the producer, rollout workers, policy stages, trainer(s) and evaluator(s) as
    separate processes, supervise them, stop when the trainers reach their step budget (or on
    Ctrl-C), and leave the run directory: config, logs, metrics.jsonl, final weights, plots.
    An existing run directory is refused unless --fresh (delete it) or --resume (continue
    it). Exit codes: 0 done; 1 a config or run error; 2 usage; 3 a role failed for good
    (it exhausted launch.max_restarts)."""
    import sys

    from astraflow.cli.common import fail, find_user_code, with_env_bus
    from astraflow.config import load_experiment
    from astraflow.core.errors import AstraflowError
    from astraflow.run.orchestrate import check_out, run_experiment
    from astraflow.run.warmup import from_warm

    if fresh and resume:  # a usage error: exit 2
        raise typer.BadParameter("--fresh and --resume: give one (--fresh deletes the run "
                                 "directory, --resume continues the run in it)")
    sets = with_env_bus(overrides)
    if bus is not None and bus != "embedded":
        sets.append(f"bus.url={bus}")
    find_user_code(config)  # here, and in every role (they inherit $PYTHONPATH)
    try:
        cfg = load_experiment(config, sets)
        out = out or Path("runs") / cfg.run
        if warm is not None:
            if warmup_only:
                raise fail("--warm and --warmup-only: give one (--warm skips the warm-up)")
            if fresh and warm.resolve().is_relative_to(out.resolve()):
                raise fail(f"--warm {warm} lies in the run directory {out}, which --fresh "
                           "deletes first: give another --out")
            cfg = from_warm(cfg, warm)
        refuse_foreign_dir(out)
        check_out(out, fresh=fresh, resume=resume)  # before anything is checked or made
        if check:
            from astraflow.cli.check import run_check

            if not run_check(cfg, out, quiet=True).ok:
                raise typer.Exit(1)
        # the live view redraws a terminal; in a pipe or a file, plain lines instead
        live = live and sys.stdout.isatty()
        code = run_experiment(cfg, out, live=live, fresh=fresh, resume=resume,
                              warmup_only=warmup_only, progress=not (quiet or live))
    except AstraflowError as e:
        raise fail(str(e)) from None
    raise typer.Exit(code)
