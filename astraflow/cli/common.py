"""Shared CLI plumbing: the --bus option, error reporting, consoles. Imports stay light."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from astraflow.core.bus.url import DEFAULT_OUT, default_url

#: the --bus default: the one default bus URL (core's), in ./.astraflow
DEFAULT_BUS = default_url(DEFAULT_OUT)
BUS_ENV = "ASTRAFLOW_BUS"

BusOption = Annotated[
    str,
    typer.Option("--bus", envvar=BUS_ENV,
                 help="Bus URL: embedded:///path/bus.db (default: ./.astraflow/bus.db) or "
                      "kafka://host:port[,host:port]."),
]


#: ``--out`` of the commands that take a bus but no config (`topics`, `inspect`)
RunDirOption = Annotated[
    Path | None,
    typer.Option("--out", help="A run directory: use its embedded bus, DIR/bus.db (instead "
                               "of --bus)."),
]


def chosen_bus(bus: str, out: Path | None) -> str:
    """The bus URL of a command with ``--bus`` and ``--out``: the run directory's embedded bus
    when ``out`` is given, else ``bus``."""
    from astraflow.core.bus.url import embedded_url

    return embedded_url(out.resolve() / "bus.db") if out is not None else bus


def existing_bus(bus: str, out: Path | None, command: str) -> str:
    """:func:`chosen_bus` for a command that reads a run (``command``, e.g. `astraflow
    inspect`): an embedded bus whose file does not exist is refused, never created (a
    command pointed at nothing used to leave an empty ./.astraflow/bus.db behind)."""
    from astraflow.core.bus.url import parse_url
    from astraflow.core.errors import BusURLError

    url = chosen_bus(bus, out)
    try:
        parsed = parse_url(url)
    except BusURLError as e:
        raise fail(str(e)) from None
    if parsed.scheme == "embedded" and parsed.path is not None and not parsed.path.exists():
        given = (f"--out {out}" if out is not None else
                 "the default --bus" if bus == DEFAULT_BUS else f"--bus {bus}")
        raise fail(f"no bus at {parsed.path} ({given}): `{command}` reads the bus of a run and "
                   "never creates one. Give the run directory with --out DIR (e.g. --out "
                   "runs/<run>, where `astraflow run` keeps its bus.db), or the run's bus with "
                   f"--bus URL (embedded:///path/to/bus.db, kafka://host:port; or ${BUS_ENV})")
    return url


def with_env_bus(overrides: list[str] | None) -> list[str]:
    """``--set`` overrides with ``ASTRAFLOW_BUS`` (when set) as the first: every command that
    reads an experiment config takes its bus from the environment like the commands with
    ``--bus`` do; an explicit ``--set bus.url=...`` or ``--bus`` still wins."""
    sets = list(overrides or [])
    url = os.environ.get(BUS_ENV)
    return [f"bus.url={url}", *sets] if url else sets


#: ``--out`` of every command that takes an experiment config: one rule, ``runs/<run>``
OutOption = Annotated[
    Path | None,
    typer.Option("--out", help="Run directory: {out} in the config, where the embedded bus "
                               "lives (default: runs/<run>, <run> the config's run name)."),
]


def run_dir(cfg: Any, out: Path | None) -> Path:
    """The run directory of a command: ``out``, else ``runs/<run>`` (where `astraflow run`
    puts a run of that config)."""
    return out if out is not None else Path("runs") / cfg.run


def embedded_bus_file(cfg: Any, out: Path) -> Path | None:
    """The file of the config's embedded bus in run directory ``out``; None on Kafka."""
    from astraflow.core.bus.url import parse_url, url_path
    from astraflow.core.paths import expand

    url = parse_url(expand(cfg.bus.url, out=url_path(out.resolve())))
    return url.path if url.scheme == "embedded" else None


def load_role(path: Any, overrides: list[str] | None, out: Path | None) -> tuple[Any, Path]:
    """The config of a role (``load_config``) and its run directory (``run_dir``), which must
    hold the run's embedded bus: a role joins a run, it never starts an empty one (a
    forgotten ``--out`` used to join a new ``./bus.db`` and wait there forever). On Kafka
    the directory only holds checkpoints and logs, and is made if missing."""
    cfg = load_config(path, overrides)
    d = run_dir(cfg, out)
    bus = embedded_bus_file(cfg, d)
    if bus is not None and not bus.exists():
        from astraflow.core.bus.url import embedded_url

        policies = " ".join(f"--policy {p}" for p in cfg.policies)
        raise fail(f"no bus in the run directory {d} ({bus} does not exist): a role joins a "
                   f"run, it does not start one. Start the run with `astraflow run "
                   f"{path if path is not None else 'CONFIG'} "
                   f"--out {d}` (it creates the bus and topics), give the directory of a "
                   f"running run with --out DIR, or create its topics with `astraflow topics "
                   f"create --run {cfg.run} {policies} --bus {embedded_url(bus)}`")
    return cfg, d


def report_line(message: str, label: str = "error", style: str = "bold red") -> None:
    """Print ``label: message`` to stderr: the label styled, the message as it is (escaped:
    a ``[a, b]`` or ``[gateway]`` in it is text, not rich markup) and with no secret it
    quotes (a token, a password, a key)."""
    from rich.console import Console
    from rich.markup import escape

    from astraflow.core.redact import redact_text

    # soft wrap: a path or a command in the message stays whole, to be copied
    Console(stderr=True, soft_wrap=True).print(
        f"[{style}]{label}:[/] {escape(redact_text(message))}", highlight=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error a person can act on (no traceback; see :func:`report_line`) and return
    the Exit to raise."""
    report_line(message)
    return typer.Exit(code)


def warn(message: str) -> None:
    """Print a warning a person should act on (the run goes on)."""
    report_line(message, "warning", "bold yellow")


def read_secret_file(path: Path, flag: str) -> str:
    """The secret in file ``path`` (its first line, surrounding whitespace removed); an
    empty, unreadable or multi-line file is an error; one others may read, a warning."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"{flag} {path}: cannot be read ({getattr(e, 'strerror', None) or e})") \
            from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise fail(f"{flag} {path}: expected the secret alone on one line, found "
                   f"{len(lines)} non-empty lines")
    if mode & 0o077:
        warn(f"{flag} {path} can be read by other users (mode {mode & 0o777:o}): "
             f"chmod 600 {path}")
    return lines[0].strip()


def secret_option(value: str | None, file: Path | None, *, flag: str, env: str) -> str | None:
    """A secret given to a command: from ``{flag}-file`` (a file), else from ``flag`` itself
    (kept working, with a warning: a command line is visible to every user of the machine in
    ``ps`` and /proc), else from ``$env``. None: not given."""
    if value is not None and file is not None:
        raise fail(f"give {flag} or {flag}-file, not both")
    if file is not None:
        return read_secret_file(file, f"{flag}-file")
    if value is not None:
        warn(f"{flag} on the command line is visible to every user of this machine (ps, "
             f"/proc/PID/cmdline): give it with {flag}-file FILE or in ${env} instead")
        return value
    return os.environ.get(env) or None


def find_user_code(path: Any) -> None:
    """Let ``module.path:function`` names (a reward, a workflow, a tool) and
    rollout.workflow.modules find a user's own files in the current directory and in the
    directory of the config at ``path``, in this process and in every role it starts."""
    from astraflow.core.registry import add_code_dirs

    add_code_dirs(Path.cwd(), *([Path(path).parent] if path is not None else []))


def load_config(path: Any, overrides: list[str] | None) -> Any:
    """The experiment config at ``path`` with ``--set`` overrides (a user's modules found
    beside it: :func:`find_user_code`); a ConfigError becomes a one-line error and exit
    code 1."""
    from astraflow.config import load_experiment
    from astraflow.core.errors import ConfigError

    find_user_code(path)
    try:
        return load_experiment(path, with_env_bus(overrides))
    except ConfigError as e:
        raise fail(str(e)) from None


@contextlib.contextmanager
def role_run() -> Iterator[Callable[[], bool]]:
    """The body of a long-running role: yields ``should_stop``, which turns true on SIGTERM
    or SIGINT (the role then drains instead of dying); an AstraflowError becomes a one-line
    error and exit code 1; the previous signal handlers are restored on the way out."""
    from astraflow.core.errors import AstraflowError

    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield lambda: stop
    except AstraflowError as e:
        raise fail(str(e)) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
