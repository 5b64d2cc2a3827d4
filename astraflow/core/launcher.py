"""The one launcher of role processes: `astraflow run`'s supervisor and the scaler's ``local``
actuator both start, stop and reap their children here.

A role process (:class:`Child`) runs in a session of its own, its output appended to one log
file. Stopping is SIGTERM to its group, then SIGKILL after a grace period; :func:`stop_all`
stops many against one deadline. A role started with ``ASTRAFLOW_LAUNCHER_PID``
(:func:`role_env`) stops itself once its launcher is gone (:func:`stop_when_orphaned`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from astraflow.core import forkserver
from astraflow.core.forkserver import ForkedProcess
from astraflow.core.metrics import PORT_ENV

LAUNCHER_PID_ENV = "ASTRAFLOW_LAUNCHER_PID"
POLL_S = 1.0
TAIL_BYTES = 64 * 1024  # Child.tail reads no more than this of a log

log = logging.getLogger("astraflow.launcher")


def cli(*args: str) -> list[str]:
    """The argv of an `astraflow` subcommand run with this interpreter."""
    return [sys.executable, "-m", "astraflow.cli.app", *args]


def launcher_env() -> dict[str, str]:
    """What the launcher adds to its roles' environment."""
    return {LAUNCHER_PID_ENV: str(os.getpid())}


def role_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a role this process launches: its own, unbuffered, naming this
    process as the launcher, plus ``extra``. The metrics port is not inherited (several
    children would bind one port): only ``extra`` or :class:`Child`'s ``metrics_port`` set it."""
    base = {k: v for k, v in os.environ.items() if k != PORT_ENV}
    return {**base, "PYTHONUNBUFFERED": "1", **launcher_env(), **(extra or {})}


class Child:
    """One role process at a time, in its own session, logging to ``log_path``.

    :meth:`start` may be called again once the process ended (a restart): the log file stays
    open across starts, and ``proc`` is the newest process."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self._log: IO[bytes] | None = None

    def start(self, argv: Sequence[str], env: Mapping[str, str], *, nice: int = 0,
              metrics_port: int | None = None) -> subprocess.Popen[bytes] | ForkedProcess:
        """Start ``argv`` with ``env`` (see :func:`role_env`); ``nice`` is added to its
        scheduling niceness (> 0: it gets the CPU last). A role command is forked from a fork
        server (:mod:`astraflow.core.forkserver`), any other command is a fresh process.
        Raises OSError when it cannot."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:  # unbuffered: a banner a full disk refused is not left pending
            self._log = self.log_path.open("ab", buffering=0)  # for the next start to flush
        with contextlib.suppress(OSError):  # a full disk: the banner is lost, the role starts
            self._log.write(f"\n=== start {time.strftime('%H:%M:%S')} "
                            f"{' '.join(argv)}\n".encode())
        env = dict(env)
        if metrics_port is not None:
            env[PORT_ENV] = str(metrics_port)
        self.proc = _start(argv, env, self._log, self.log_path)
        if nice:  # before the child starts threads (they inherit its niceness)
            with contextlib.suppress(OSError):  # a child that died at once
                os.setpriority(os.PRIO_PROCESS, self.proc.pid,
                               min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
        return self.proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The exit code of the current process; None while it runs (or before any start)."""
        return self.proc.poll() if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process's group, if it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def reap(self, timeout: float | None,
             on_kill: Callable[[Child], None] | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end, then SIGKILL it (calling
        ``on_kill`` first) and wait for that. Its exit code; None if it was never started.
        ``timeout=None``: wait as long as it takes."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(self)
            self.signal(signal.SIGKILL)
            return self.proc.wait()  # SIGKILL cannot be caught: it ends once the kernel reaps it

    def stop(self, grace_s: float, on_kill: Callable[[Child], None] | None = None
             ) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
        self.signal(signal.SIGTERM)
        return self.reap(grace_s, on_kill)

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the log (within its last 64 KiB)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
                data = f.read(TAIL_BYTES)
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        """Close the log file (the process, if any, is not touched)."""
        if self._log is not None:
            self._log.close()
            self._log = None


def prestart(extra: Mapping[str, str] | None = None) -> None:
    """Start the fork server now, in the background, with a role's environment (``extra`` as
    for :func:`role_env`): it imports while the launcher prepares the run."""
    if forkserver.enabled():
        for profile in forkserver.PRELOAD:
            forkserver.server(profile).prestart(role_env(extra))


def _start(argv: Sequence[str], env: Mapping[str, str], log_file: IO[bytes], log_path: Path
           ) -> subprocess.Popen[bytes] | ForkedProcess:
    profile = forkserver.forkable(argv) if forkserver.enabled() else None
    if profile is not None:
        try:
            return forkserver.server(profile).start(argv, env, log_path)
        except forkserver.ForkServerError as e:  # a fresh process, then
            log.warning("fork server: %s; starting %s as a fresh process", e, argv[3])
    return subprocess.Popen(list(argv), stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def stop_all(children: Iterable[Child], grace_s: float,
             on_kill: Callable[[Child], None] | None = None) -> list[int | None]:
    """Stop many at once: SIGTERM to each, then each is reaped against one deadline
    ``grace_s`` away (SIGKILL for the ones still running then). Their exit codes, in order."""
    children = list(children)
    for c in children:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    return [c.reap(max(0.1, deadline - time.monotonic()), on_kill) for c in children]


def stop_when_orphaned(poll_s: float = POLL_S) -> threading.Thread | None:
    """In a role started by the launcher: a daemon thread that sends this process SIGTERM once
    its parent is not the launcher any more. None where there is nothing to watch."""
    raw = os.environ.pop(LAUNCHER_PID_ENV, None)
    if not raw:
        return None
    try:
        launcher = int(raw)
    except ValueError:
        log.warning("%s=%r is not a process id; not watching the launcher", LAUNCHER_PID_ENV,
                    raw)
        return None
    if os.getppid() != launcher:  # the launcher died while this role started (the variable is
        _orphaned(launcher)       # set by the launcher alone, for its own children)
        return None

    def watch() -> None:
        stopped = threading.Event()
        while not stopped.wait(poll_s):
            if os.getppid() != launcher:
                _orphaned(launcher)
                return

    thread = threading.Thread(target=watch, name="launcher-watch", daemon=True)
    thread.start()
    return thread


def _orphaned(launcher: int) -> None:
    # "astraflow run": the launcher a person knows (the scaler's local actuator is one too)
    log.warning("the launcher of this role (astraflow run, pid %d) is gone: stopping "
                "(SIGTERM to this process)", launcher)
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["LAUNCHER_PID_ENV", "Child", "cli", "launcher_env", "prestart", "role_env", "stop_all",
           "stop_when_orphaned"]
