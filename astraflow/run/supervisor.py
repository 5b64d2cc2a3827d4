"""The supervisor behind `astraflow run`: starts every role as its own OS process, watches
them, restarts the ones that die (by config), and stops everything when the run is over.

It is not in charge of the dataflow: the roles coordinate through the topics only. Processes
are started, stopped and reaped by :mod:`astraflow.core.launcher`, as the scaler's ``local``
actuator's are.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.core.launcher import Child, role_env, stop_all

if TYPE_CHECKING:
    import subprocess

    from astraflow.core.forkserver import ForkedProcess

log = logging.getLogger("astraflow.run")

@dataclass
class RoleSpec:
    """One process to run: its name (unique), command line and restart rule."""

    name: str
    argv: list[str]
    restart: bool = True
    terminal: bool = False  # the phase ends when every terminal role exits 0
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int | None = None  # ASTRAFLOW_METRICS_PORT of the role, kept on restart
    nice: int = 0  # added to the role's scheduling niceness (> 0: it gets the CPU last)


@dataclass
class RoleProcess:
    """A role of the phase: its process (a :class:`~astraflow.core.launcher.Child`, started
    again on a restart) and what the supervisor knows of its exits."""

    spec: RoleSpec
    log_path: Path
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    handled: bool = False  # the current process's exit has been dealt with
    unstarted: bool = False  # a restart raised OSError: tried again at the next check
    retiring: float | None = None  # monotonic time retire() asked it to stop
    child: Child = field(init=False)

    def __post_init__(self) -> None:
        self.child = Child(self.log_path)

    @property
    def proc(self) -> subprocess.Popen[bytes] | ForkedProcess | None:
        """The current process (a new one after each restart)."""
        return self.child.proc

    @property
    def state(self) -> str:
        if self.child.proc is None:
            return "pending"
        rc = self.child.poll()
        if rc is None:
            return "running"
        return "done" if rc == 0 else f"exited {rc}"

    def start(self, base_env: dict[str, str]) -> None:
        self.handled = False
        self.child.start(self.spec.argv, {**base_env, **self.spec.env}, nice=self.spec.nice,
                         metrics_port=self.spec.metrics_port)

    def tail(self, n: int = 30) -> str:
        return self.child.tail(n)

    def signal(self, sig: int) -> None:
        self.child.signal(sig)

    def close(self) -> None:
        self.child.close()


class Supervisor:
    """Runs one phase (a set of roles) until its terminal roles finish or it is stopped."""

    def __init__(self, out: Path, *, max_restarts: int = 5, grace_s: float = 20.0,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.out = out
        self.max_restarts = max_restarts
        self.grace_s = grace_s
        self.on_event = on_event or (lambda msg: log.warning("%s", msg))
        self.roles: dict[str, RoleProcess] = {}
        self.events: list[str] = []
        self.failed: list[str] = []
        # role_env names this process the launcher: a role stops itself if this process dies
        # without stopping it (core/launcher.py)
        self.env = role_env()
        self._unwritten: set[str] = set()  # files whose last write failed (said once)

    def event(self, msg: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {msg}")
        self.on_event(msg)

    def start(self, specs: list[RoleSpec]) -> None:
        for spec in specs:
            if spec.name in self.roles and self.roles[spec.name].state == "running":
                raise ValueError(f"role {spec.name} is already running")
            rp = RoleProcess(spec, self.out / "logs" / f"{spec.name}.log")
            self.roles[spec.name] = rp
            rp.start(self.env)
        self._write_pids()
        self._write_scrape_targets()

    def _write_pids(self) -> None:
        """``processes.json`` in the run directory: role → pid, for operators and tests."""
        pids = {n: r.proc.pid for n, r in self.roles.items() if r.proc is not None}
        self._write_file("processes.json", json.dumps(pids))

    def _write_file(self, name: str, text: str) -> None:
        """Write ``name`` in the run directory atomically. A failure (the disk full) is said
        once and the run goes on: these files are for operators, and raising here would kill
        the supervisor in the middle of a restart, leaving every role running unattended."""
        tmp = self.out / f".{name}.tmp"
        try:
            tmp.write_text(text)
            tmp.replace(self.out / name)
        except OSError as e:
            if name not in self._unwritten:
                self._unwritten.add(name)
                self.event(f"{name} not written ({e}); the run goes on, retrying at the next "
                           "change")
            return
        self._unwritten.discard(name)

    def _write_scrape_targets(self) -> None:
        """``prometheus-targets.json`` in the run directory, in Prometheus' file_sd format: one
        target per role that serves metrics, labelled ``service`` with the role's name (as the
        compose stack labels its containers), so a Prometheus on this host can scrape the run
        (``deploy/prometheus/local.yml``). The series carry ``run`` themselves."""
        targets = [{"targets": [f"127.0.0.1:{r.spec.metrics_port}"],
                    "labels": {"service": n}}
                   for n, r in self.roles.items() if r.spec.metrics_port is not None]
        if not targets:
            return
        # atomic: Prometheus re-reads it
        self._write_file("prometheus-targets.json", json.dumps(targets, indent=1))

    def check(self) -> bool:
        """Look at every process once: restart dead ones by their rule. True while the phase
        goes on (some terminal role has not finished successfully)."""
        terminals = [r for r in self.roles.values() if r.spec.terminal]
        for r in self.roles.values():
            if (r.retiring is not None and r.state == "running"
                    and time.monotonic() - r.retiring > self.grace_s):
                self.event(f"role {r.spec.name} did not stop in {self.grace_s:.0f}s; killing")
                r.signal(signal.SIGKILL)
            if r.unstarted:
                self._restart(r, "was not started")
                continue
            rc = r.proc.poll() if r.proc is not None and not r.handled else None
            if rc is None:
                continue
            r.handled = True  # this exit is dealt with once
            if r.retiring is not None:
                r.exit_codes.append(rc)
                self.event(f"role {r.spec.name} stopped (scale-down, exit {rc})")
                continue
            if rc == 0:
                continue  # finished its work (a terminal role, or a producer that is done)
            r.exit_codes.append(rc)
            if r.spec.restart:
                self._restart(r, f"died (exit {rc})", f" Log tail:\n{r.tail(15)}")
            else:
                self.failed.append(r.spec.name)
                self.event(f"role {r.spec.name} died (exit {rc}) and is not restarted. "
                           f"Log tail:\n{r.tail(15)}")
        if any(r.spec.name in self.failed for r in terminals):
            return False
        return not terminals or any(r.state != "done" for r in terminals)

    def _restart(self, r: RoleProcess, what: str, tail: str = "") -> None:
        """Start role ``r`` again after it ``what``, if restarts are left. A start that raises
        OSError (a fork refused, a file that cannot be opened) counts as a restart and is tried
        again at the next check: the supervisor goes on either way, for the other roles."""
        if r.restarts >= self.max_restarts:
            r.unstarted = False
            self.failed.append(r.spec.name)
            self.event(f"role {r.spec.name} {what} and is not restarted "
                       f"({r.restarts} restarts made).{tail}")
            return
        r.restarts += 1
        self.event(f"role {r.spec.name} {what}; restarting "
                   f"({r.restarts}/{self.max_restarts}).{tail}")
        try:
            r.start(self.env)
        except OSError as e:
            r.unstarted = True
            self.event(f"role {r.spec.name} could not be started: {e}")
            return
        r.unstarted = False
        self._write_pids()

    def add(self, spec: RoleSpec) -> None:
        """Start one more role while the phase goes on (a scaled-up rollout process)."""
        self.start([spec])
        self.event(f"role {spec.name} started")

    def retire(self, name: str) -> None:
        """Ask role ``name`` to stop for good without waiting (a scale-down): SIGTERM now (a
        rollout worker drains), SIGKILL if it is still running ``grace_s`` later (see
        :meth:`check`); its exit is neither restarted nor a failure."""
        r = self.roles[name]
        if r.retiring is not None:
            return
        r.spec.restart = False
        r.retiring = time.monotonic()
        r.signal(signal.SIGTERM)
        self.event(f"role {name} asked to stop (scale-down)")

    def retiring(self) -> list[str]:
        """Roles asked to stop by :meth:`retire` that have not exited yet."""
        return [n for n, r in self.roles.items() if r.retiring is not None
                and r.state == "running"]

    def stop(self, names: list[str] | None = None) -> dict[str, int | None]:
        """SIGTERM (drain), then SIGKILL after the grace period. Returns exit codes."""
        targets = [self.roles[n] for n in (names or list(self.roles))]
        by_child = {id(r.child): r for r in targets}

        def killing(child: Child) -> None:
            name = by_child[id(child)].spec.name
            self.event(f"role {name} did not stop in {self.grace_s:.0f}s; killing")

        stop_all([r.child for r in targets], self.grace_s, killing)
        codes = {r.spec.name: (r.proc.returncode if r.proc else None) for r in targets}
        for r in targets:
            r.close()
        return codes

    def states(self) -> dict[str, str]:
        return {name: r.state + (f" (restarts {r.restarts})" if r.restarts else "")
                + (" (scaled down)" if r.retiring is not None else "")
                for name, r in self.roles.items()}
