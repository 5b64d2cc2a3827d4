"""`astraflow check CONFIG`: every problem of an experiment found before a role starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from astraflow.config import ExperimentConfig
    from astraflow.run.check import CheckReport


def check(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
    out: Annotated[Path | None, typer.Option(
        help="Run directory that {out} in paths stands for (default: runs/<run>).")] = None,
    weights: Annotated[bool, typer.Option(
        help="Require each model folder's weights (--no-weights: its config and tokenizer "
             "suffice, for a config prepared where the weights are not).")] = True,
    gpu_gb: Annotated[float, typer.Option(
        "--gpu-gb", help="GPU memory (GB) the trainer's estimate is compared with.")] = 80.0,
    role: Annotated[list[str] | None, typer.Option(
        "--role", help="A role this host runs (repeatable): produce, policy, rollout, train, "
                       "evaluate, serve; only what they need is checked (a rollout host: the "
                       "model and engine, not the producer's data). Default: every role.")]
    = None,
) -> None:
    """Load each policy's model config and tokenizer and render one prompt with its chat
    template, read the first rows of every data split, import every module the config names
    and score one sample with the reward, estimate the trainer's and engines' memory; list
    every problem with its key path and exit 1 if there is one (`astraflow run` runs the same
    check first). On one host of several, --role says which roles it runs."""
    from astraflow.cli.common import fail, load_config
    from astraflow.run.check import ROLES

    unknown = [r for r in role or [] if r not in ROLES]
    if unknown:
        raise fail(f"unknown --role {', '.join(unknown)}; valid: {', '.join(ROLES)}", code=2)
    cfg = load_config(config, overrides)
    report = run_check(cfg, out or Path("runs") / cfg.run, weights=weights, gpu_gb=gpu_gb,
                       roles=role or None)
    raise typer.Exit(0 if report.ok else 1)


def run_check(cfg: ExperimentConfig, out: Path, *, quiet: bool = False,
              weights: bool = True, gpu_gb: float = 80.0,
              roles: list[str] | None = None) -> CheckReport:
    """Run the check with a status line, print its findings (problems only when ``quiet``),
    and return the report."""
    from rich.console import Console
    from rich.markup import escape

    from astraflow.run.check import check_experiment

    console = Console(stderr=True)
    with console.status("checking the config") as status:
        report = check_experiment(cfg, out, weights=weights, gpu_gb=gpu_gb, roles=roles,
                                  progress=lambda what: status.update(f"checking: {escape(what)}"))
    for f in report.findings:
        if f.ok and quiet:
            continue
        mark = "[green]ok[/]" if f.ok else "[bold red]problem[/]"
        # soft wrap: a path or key is never broken across lines (logs and tests grep them)
        # escaped: a key (policies.post[1]) or a message ([a, b]) is text, not markup
        console.print(f"{mark} [bold]{escape(f.key)}[/]: {escape(f.message)}", highlight=False,
                      soft_wrap=True)
    n = len(report.problems)
    if n:
        console.print(f"[bold red]{n} problem{'s' * (n != 1)}[/]: fix the keys above "
                      "(`--set key=value` overrides one)", highlight=False, soft_wrap=True)
    elif not quiet:
        console.print("[green]the config passes its check[/]", highlight=False)
    return report
