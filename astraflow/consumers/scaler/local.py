"""The ``local`` actuator: starts and stops ``astraflow rollout`` processes on this host.

Scaling up starts processes (output in ``<out>/logs/scaled-<pool>-<n>.log``); scaling down
sends SIGTERM to the newest ones and returns at once, a reaper thread sending SIGKILL after
``grace_s``. Stopping processes are not counted; one that died on its own is dropped and
logged. Under ``astraflow run`` the supervisor owns the rollout processes and the run uses its
own supervisor-backed actuator instead.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from astraflow.consumers.scaler.actuation import Actuation
from astraflow.core.forkserver import ForkedProcess
from astraflow.core.launcher import Child, cli, role_env

log = logging.getLogger("astraflow.scaler")


def rollout_argv(config_path: str, out: str, rollout_args: Sequence[str] = ()) -> list[str]:
    """The command line of one ``astraflow rollout`` process run with this interpreter."""
    return cli("rollout", str(config_path), "--out", str(out), *rollout_args)


@dataclass
class _Proc:
    n: int  # the actuator's sequence number of this process (its log file's)
    child: Child
    stopping: bool = False

    @property
    def proc(self) -> subprocess.Popen[bytes] | ForkedProcess:
        assert self.child.proc is not None  # a _Proc is made once its process started
        return self.child.proc


class LocalActuator:
    """Keeps a list of the rollout processes it started; :meth:`count` is how many of them
    are running and not being stopped. It ignores the caller's ``current``: the processes it
    started are the pool.

    ``argv(n)`` gives the command line of the ``n``-th process it starts (0, 1, ...); the
    default runs ``astraflow rollout config_path --out out *rollout_args``.
    """

    def __init__(self, *, config_path: str | None = None, out: str | Path = ".",
                 pool: str = "rollout", rollout_args: Sequence[str] = (),
                 argv: Callable[[int], list[str]] | None = None, grace_s: float = 60.0,
                 env: Mapping[str, str] | None = None) -> None:
        if argv is None:
            if config_path is None:
                raise ValueError("LocalActuator needs config_path or argv")
            default = rollout_argv(str(config_path), str(out), rollout_args)

            def argv(n: int) -> list[str]:
                return list(default)
        self.argv = argv
        self.out = Path(out)
        self.pool = pool
        self.grace_s = grace_s
        # role_env: no inherited metrics port (several children would bind one), and a child
        # stops itself if this process dies without stopping it
        self.env = role_env(env)
        self.exit_codes: dict[int, int] = {}  # n -> return code, of every process that ended
        self._procs: list[_Proc] = []  # oldest first; stopping ones stay until reaped
        self._reapers: list[threading.Thread] = []
        self._next = 0
        self._lock = threading.Lock()

    # -- state ---------------------------------------------------------------------------------

    def _ended(self, p: _Proc, rc: int) -> None:
        """Forget ``p`` (lock held)."""
        self.exit_codes[p.n] = rc
        with contextlib.suppress(ValueError):
            self._procs.remove(p)
        p.child.close()

    def _drop_dead(self) -> None:
        """Drop the processes that exited on their own (crashed, or finished early)."""
        with self._lock:
            for p in list(self._procs):
                if p.stopping:
                    continue  # its reaper deals with it
                rc = p.proc.poll()
                if rc is not None:
                    self._ended(p, rc)
                    log.warning("rollout process exited pool=%s n=%d pid=%d exit=%d log=%s",
                                self.pool, p.n, p.proc.pid, rc, p.child.log_path)

    def count(self) -> int:
        """Running processes that are not being stopped."""
        self._drop_dead()
        with self._lock:
            return sum(1 for p in self._procs if not p.stopping)

    def stopping(self) -> int:
        """Processes sent SIGTERM that have not exited yet."""
        with self._lock:
            return sum(1 for p in self._procs if p.stopping)

    def pids(self) -> list[int]:
        """Pids of the counted processes, oldest first."""
        with self._lock:
            return [p.proc.pid for p in self._procs if not p.stopping]

    # -- actions -------------------------------------------------------------------------------

    def _start_one(self) -> _Proc:
        n = self._next
        self._next += 1
        child = Child(self.out / "logs" / f"scaled-{self.pool}-{n}.log")
        try:
            child.start(self.argv(n), self.env)
        except BaseException:
            child.close()
            raise
        p = _Proc(n, child)
        with self._lock:
            self._procs.append(p)
        log.info("rollout process started pool=%s n=%d pid=%d log=%s", self.pool, n,
                 p.proc.pid, child.log_path)
        return p

    def _reap(self, p: _Proc, grace_s: float) -> None:
        def killing(_: Child) -> None:
            log.warning("rollout process did not stop in %.0fs; killing pool=%s n=%d pid=%d",
                        grace_s, self.pool, p.n, p.proc.pid)

        rc = p.child.reap(grace_s, killing)
        assert rc is not None  # started
        with self._lock:
            self._ended(p, rc)
        log.info("rollout process stopped pool=%s n=%d pid=%d exit=%d", self.pool, p.n,
                 p.proc.pid, rc)

    def _stop(self, victims: list[_Proc]) -> None:
        """SIGTERM ``victims`` and hand each to a reaper thread."""
        for p in victims:
            with self._lock:
                p.stopping = True
            p.child.signal(signal.SIGTERM)
            t = threading.Thread(target=self._reap, args=(p, self.grace_s), daemon=True,
                                 name=f"reap-{self.pool}-{p.n}")
            t.start()
            self._reapers.append(t)

    def scale(self, target: int, current: int) -> Actuation:
        """Start or stop processes until :meth:`count` is ``target``; stopping the newest
        first. Returns at once (stopping processes drain in the background). Never raises
        for a process that cannot start: the Actuation says so."""
        t0 = time.monotonic()
        target = max(0, target)
        previous = self.count()
        if target > previous:
            for _ in range(target - previous):
                try:
                    self._start_one()
                except (OSError, subprocess.SubprocessError) as e:
                    error = f"cannot start a rollout process: {e}"
                    log.error("actuator local failed pool=%s target=%d previous=%d error=%r",
                              self.pool, target, previous, error)
                    return Actuation(False, target, previous, 1, error, time.monotonic() - t0)
        elif target < previous:
            with self._lock:
                running = [p for p in self._procs if not p.stopping]
                victims = running[target:][::-1]  # the newest
            self._stop(victims)
            log.info("rollout processes stopping pool=%s n=%s grace_s=%.0f", self.pool,
                     ",".join(str(p.n) for p in victims), self.grace_s)
        attempts = 0 if target == previous else 1
        return Actuation(True, target, previous, attempts, "", time.monotonic() - t0)

    def close(self) -> None:
        """Stop every process it started (SIGTERM, SIGKILL after ``grace_s``) and wait for
        them all."""
        self._drop_dead()
        with self._lock:
            victims = [p for p in self._procs if not p.stopping]
        self._stop(victims)
        deadline = time.monotonic() + self.grace_s + 10.0
        for t in list(self._reapers):
            t.join(max(0.0, deadline - time.monotonic()))
        self._reapers = [t for t in self._reapers if t.is_alive()]
