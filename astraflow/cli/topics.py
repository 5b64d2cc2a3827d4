"""`astraflow topics`: create, list and describe topics on a bus."""

from __future__ import annotations

from typing import Annotated

import typer

from astraflow.cli.common import (
    DEFAULT_BUS,
    BusOption,
    RunDirOption,
    chosen_bus,
    existing_bus,
)

app = typer.Typer(help="Create, list and describe topics.", no_args_is_help=True)


@app.command()
def create(
    names: Annotated[list[str] | None, typer.Argument(help="Topic names to create.")] = None,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = 1,
    run: Annotated[str | None, typer.Option(help="Create every topic of this run instead.")] = None,
    policy: Annotated[list[str] | None, typer.Option(help="Policies of the run (repeat).")] = None,
    bus: BusOption = DEFAULT_BUS,
    out: RunDirOption = None,
) -> None:
    """Create topics (idempotent), and the embedded bus if it does not exist yet. `--run
    NAME` creates every topic of a run from the topic table with its default partition
    count."""
    from astraflow.core.bus import connect
    from astraflow.core.topics import run_topics

    wanted: dict[str, int] = {n: partitions for n in names or []}
    if run:
        wanted.update(run_topics(run, policy or ["default"]))
    if not wanted:
        raise typer.BadParameter("give topic names or --run")
    b = connect(chosen_bus(bus, out))
    b.create_topics(wanted)
    for name, n in sorted(wanted.items()):
        typer.echo(f"{name}\t{n}")
    b.close()


@app.command("list")
def list_(bus: BusOption = DEFAULT_BUS, out: RunDirOption = None) -> None:
    """List topics and their partition counts."""
    from astraflow.core.bus import connect

    b = connect(existing_bus(bus, out, "astraflow topics list"))
    for name, n in sorted(b.list_topics().items()):
        typer.echo(f"{name}\t{n}")
    b.close()


@app.command()
def describe(
    name: str,
    group: Annotated[list[str] | None, typer.Option(help="Show this group's lag (repeat).")] = None,
    bus: BusOption = DEFAULT_BUS,
    out: RunDirOption = None,
) -> None:
    """Partitions, end offsets and (with --group) committed offsets and lag."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from astraflow.core.bus import connect

    b = connect(existing_bus(bus, out, "astraflow topics describe"))
    info = b.describe_topic(name)
    console = Console()
    console.print(f"[bold]{escape(name)}[/]: {info.partitions} partitions", highlight=False)
    table = Table()
    table.add_column("partition", justify="right")
    table.add_column("end offset", justify="right")
    groups = group or []
    committed = {g: b.committed(g, name) for g in groups}
    for g in groups:
        table.add_column(f"{g} committed", justify="right")
        table.add_column(f"{g} lag", justify="right")
    for p in range(info.partitions):
        end = info.end_offsets.get(p, 0)
        row = [str(p), str(end)]
        for g in groups:
            c = committed[g].get(p)
            row += ["-" if c is None else str(c), str(end - (c or 0))]
        table.add_row(*row)
    console.print(table)
    b.close()
