"""``astraflow broker``: a local single-node Apache Kafka for development and tests.

Only typer and the standard library are imported here; the broker module and rich load inside
the commands, so ``astraflow --help`` stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from astraflow.core.broker import LocalBroker

app = typer.Typer(
    help="Run a local single-node Apache Kafka broker (KRaft) from jars fetched with Maven. "
         "Needs Java 17+ and Maven (apt-get install -y openjdk-17-jre-headless maven).",
    no_args_is_help=True,
)

DirOption = Annotated[Path | None, typer.Option(
    "--dir", help="Broker data directory (default: $ASTRAFLOW_BROKER_DIR or "
                  "~/.cache/astraflow/broker).")]


def default_dir() -> Path:
    env = os.environ.get("ASTRAFLOW_BROKER_DIR")
    return Path(env) if env else Path.home() / ".cache" / "astraflow" / "broker"


@contextmanager
def _errors() -> Iterator[None]:
    """BrokerError → its message in red and exit code 1, without a traceback."""
    from astraflow.core.errors import BrokerError

    try:
        yield
    except BrokerError as e:
        from astraflow.cli.common import fail

        raise fail(str(e)) from None


@contextmanager
def _spinner(first: str) -> Iterator[Callable[[str], None]]:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    with console.status(escape(first)) as status:
        def say(msg: str) -> None:
            if msg.startswith("Fetched"):
                console.print(escape(msg))
            status.update(escape(msg))

        yield say


def _running(data_dir: Path) -> LocalBroker | None:
    from astraflow.core.broker import LocalBroker
    from astraflow.core.errors import BrokerError

    try:
        broker = LocalBroker.attach(data_dir)
    except BrokerError:
        return None
    return broker if broker.pid() is not None else None


def parse_listeners(specs: list[str]) -> dict[str, tuple[int, str]]:
    """``NAME=BIND_PORT:HOST:PORT`` specs → ``{NAME: (BIND_PORT, "HOST:PORT")}``; the
    names and addresses are checked by the broker."""
    from astraflow.core.errors import BrokerError

    out: dict[str, tuple[int, str]] = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        bind, colon, advertised = rest.partition(":")
        if not eq or not colon or not bind.isdigit() or not advertised:
            raise BrokerError(f"bad --listener {spec!r}; expected "
                              "NAME=BIND_PORT:ADVERTISED_HOST:ADVERTISED_PORT, e.g. "
                              "REGION_B=19093:wan-proxy.example:29093")
        if name in out:
            raise BrokerError(f"--listener {name} given twice")
        out[name] = (int(bind), advertised)
    return out


@app.command()
def fetch() -> None:
    """Fetch the broker's jars from Maven Central into the cache (once)."""
    with _errors():
        from astraflow.core.broker import fetch_jars, kafka_version

        with _spinner(f"Checking the Kafka {kafka_version()} jars") as say:
            libs = fetch_jars(say)
        typer.echo(f"Kafka {kafka_version()} jars in {libs}")


@app.command()
def start(
    dir: DirOption = None,  # noqa: A002 (the flag's name)
    port: Annotated[int, typer.Option(help="Client port on 127.0.0.1.")] = 9092,
    controller_port: Annotated[int | None, typer.Option(
        help="KRaft controller port (default: --port + 1).")] = None,
    heap: Annotated[str, typer.Option(help="JVM heap (-Xmx).")] = "512m",
    jvm_flags: Annotated[str | None, typer.Option(
        help="The JVM's other options, space-separated (default: the client compiler and the "
             "serial collector, light for a development broker; \"\" for the JVM's own "
             "defaults, e.g. for a heavy sustained load).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait until it answers.")] = 90.0,
    listener: Annotated[list[str] | None, typer.Option(
        help="An extra plaintext listener for clients behind a proxy or NAT, as "
             "NAME=BIND_PORT:ADVERTISED_HOST:ADVERTISED_PORT (e.g. "
             "REGION_B=19093:wan-proxy.example:29093): it binds 127.0.0.1:BIND_PORT and tells "
             "clients to connect to the advertised address (docs/wan.md). Repeatable.")] = None,
) -> None:
    """Start the broker in the background (keeps data and ports across restarts)."""
    with _errors():
        from astraflow.core.broker import LocalBroker, kafka_version

        extra = parse_listeners(listener or [])
        data_dir = dir or default_dir()
        running = _running(data_dir)
        if running is not None:
            broker = running
            typer.echo("already running")
        else:
            broker = LocalBroker(data_dir, port=port,
                                 controller_port=controller_port or port + 1, heap=heap,
                                 extra_listeners=extra or None,
                                 jvm_flags=None if jvm_flags is None else jvm_flags.split())
            with _spinner("Starting Kafka") as say:
                broker.start(timeout=timeout, progress=say)
        st = broker.status()
        for name, (bind, adv) in broker.extra_listeners.items():
            typer.echo(f"  listener {name}: 127.0.0.1:{bind}, advertised as {adv}")
        typer.echo(f"Kafka {kafka_version()} running on {st.bootstrap} (pid {st.pid})\n"
                   f"  data: {st.data_dir}\n  log:  {st.log_file}\n"
                   f"Use it with:  --bus kafka://{st.bootstrap}\n"
                   f"Stop it with: astraflow broker stop --dir {st.data_dir}")


@app.command()
def stop(
    dir: DirOption = None,  # noqa: A002
    timeout: Annotated[float, typer.Option(help="Seconds before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker (SIGTERM, then SIGKILL after --timeout). Its data is kept."""
    with _errors():
        from astraflow.core.broker import LocalBroker

        broker = LocalBroker.attach(dir or default_dir())
        pid = broker.pid()
        if pid is None:
            typer.echo("not running")
            return
        broker.stop(timeout=timeout)
        typer.echo(f"stopped (pid {pid})")


@app.command()
def status(dir: DirOption = None) -> None:  # noqa: A002
    """Show whether the broker runs. Exit code 0 when it does, 1 when not."""
    with _errors():
        from astraflow.core.broker import LocalBroker

        st = LocalBroker.attach(dir or default_dir()).status()
        state = f"running (pid {st.pid})" if st.running else "stopped"
        typer.echo(f"{state}\n  bootstrap: {st.bootstrap}\n  data: {st.data_dir}\n"
                   f"  log:  {st.log_file}")
        if not st.running:
            raise typer.Exit(1)
