"""Run untrusted Python in a contained subprocess (the ``code`` reward, the ``python`` tool).

:func:`run_python` runs a program under :class:`SandboxLimits` with whatever isolation the host
allows (probed once, :func:`features`): namespaces, a root of its own, a fresh unprivileged uid,
a seccomp filter (:mod:`.sandbox_seccomp`) and resource limits. What is missing is named by
:func:`missing` and marked in :attr:`SandboxResult.unisolated`; running as the worker's own uid
is refused unless ``rollout.sandbox.allow_same_uid`` (:func:`configure`). A setup that cannot
run the code raises :class:`SandboxError`, never a silent 0. Not a VM: see docs/rollout.md,
"Rewards and the sandbox".
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.consumers.rollout.rewards.sandbox_probe import (
    Isolation,
    SandboxError,
    fresh_uid,
    interpreter,
    probe,
    spawn,
)

__all__ = ["POLICY", "STATS", "SandboxError", "SandboxLimits", "SandboxPolicy", "SandboxResult",
           "SandboxStats", "configure", "features", "isolation", "missing", "network_isolation",
           "run_python"]

log = logging.getLogger("astraflow.rollout.sandbox")

_NO_SOCKETS = """\
import socket as _af_socket
def _af_blocked(*_a, **_k):
    raise PermissionError("network access is disabled in the astraflow sandbox")
for _af_name in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
    setattr(_af_socket, _af_name, _af_blocked)
del _af_socket, _af_blocked, _af_name
"""

_probe_lock = threading.Lock()
_isolation: dict[str, Isolation] = {}


@dataclass(slots=True)
class SandboxPolicy:
    """What the process accepts (``rollout.sandbox``; :func:`configure`)."""

    allow_same_uid: bool = False  # run code as the worker's own uid where no other is possible
    warned: bool = False  # the same-uid warning was logged (once per process)


POLICY = SandboxPolicy()


def configure(*, allow_same_uid: bool) -> None:
    """Set this process's sandbox policy (``rollout.sandbox``); a worker calls it at start."""
    POLICY.allow_same_uid = allow_same_uid


def _check_uid(iso: Isolation) -> None:
    """Refuse to run code as the worker's own uid unless the config accepts it (warned once):
    that uid owns the run's checkpoints and config, and the code could use whatever of them it
    can reach, now or in a later kernel or mount bug."""
    if iso.own_uid:
        return
    uid = os.getuid()
    if not POLICY.allow_same_uid:
        why = ("the worker is not root, so it cannot give the code a uid of its own"
               if not iso.root else "this interpreter cannot run as another user (its files "
               "are not readable by others)")
        raise SandboxError(
            f"refusing to run untrusted code as the worker's own uid {uid}: {why}. Fix: run "
            "the worker as root (each sandbox then runs as a fresh unprivileged uid), or as "
            "root give the code reward an interpreter other users can read (its `python` "
            "keyword argument), or accept the risk with `rollout.sandbox.allow_same_uid: true`")
    if not POLICY.warned:
        POLICY.warned = True
        log.warning("sandbox runs untrusted code as the worker's own uid=%d "
                    "(rollout.sandbox.allow_same_uid: true): it sees only its own root (system "
                    "directories read-only, its work directory), but any of that user's files "
                    "a kernel or mount bug exposed would be its to read and write", uid)


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int | None = None  # RLIMIT_CPU; default: the timeout rounded up, plus 2
    memory_mb: int = 1024  # RLIMIT_AS
    max_procs: int = 16  # processes (and threads) the code may add; 0: no new processes
    max_file_mb: int = 16  # RLIMIT_FSIZE: any file, stdout and stderr included
    max_output_bytes: int = 64 * 1024  # of stdout/stderr read back
    network: bool = False  # True: leave the network alone
    disk_mb: int = 64  # everything it writes (work dir, /tmp, /dev/shm) together: one tmpfs


@dataclass(frozen=True, slots=True)
class SandboxResult:
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    network_isolated: bool
    seconds: float
    unisolated: tuple[str, ...] = ()  # what this host could not isolate (see missing())

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass
class SandboxStats:
    """Per process: runs, runs without full isolation, and setups that failed (raised)."""

    runs: int = 0
    unisolated_runs: int = 0
    errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, *, unisolated: bool = False, error: bool = False) -> None:
        with self._lock:
            self.runs += 1
            self.unisolated_runs += unisolated
            self.errors += error


STATS = SandboxStats()


def isolation(python: str | None = None) -> Isolation:
    """What contains code run by ``python`` (None: the worker's interpreter) here; probed once
    per process and interpreter, with a warning if anything is missing."""
    py = interpreter(python)
    with _probe_lock:
        iso = _isolation.get(py)
        if iso is None:
            iso = _isolation[py] = probe(py)
            if iso.missing():
                log.warning("sandbox cannot fully isolate code on this host python=%s "
                            "missing=%s; fix: run the worker where unprivileged namespaces "
                            "and seccomp are allowed (not in a restricted container), and "
                            "as root give the code reward an interpreter other users can "
                            "read (its `python` keyword argument)", py,
                            " | ".join(iso.missing()))
        return iso


def features(python: str | None = None) -> dict[str, bool]:
    """What this host offers sandboxes: ``namespaces`` (PID, mount: descendants die with the
    sandbox, private files), ``network`` (an empty network namespace), ``seccomp`` (the
    filter), ``drop_uid`` (as root, a uid of its own per sandbox)."""
    iso = isolation(python)
    return {"namespaces": iso.namespaces, "network": iso.network, "seccomp": iso.seccomp,
            "drop_uid": iso.own_uid}


def missing(python: str | None = None) -> tuple[str, ...]:
    """What the sandbox cannot isolate here, each with what it means (empty: nothing)."""
    return isolation(python).missing()


def network_isolation() -> bool:
    """Whether sandboxes get an empty network namespace here."""
    return features()["network"]


def _user_tasks(uid: int) -> int:
    """Processes + threads of ``uid`` (what RLIMIT_NPROC counts)."""
    n = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid == uid:
                n += len(os.listdir(f"{entry.path}/task"))
        except OSError:
            continue
    return n


def _read(path: Path, limit: int) -> tuple[str, bool]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return "", False
    return data.decode("utf-8", "replace"), size > limit


def run_python(code: str, *, limits: SandboxLimits = SandboxLimits(),
               python: str | None = None) -> SandboxResult:
    """Run ``code`` as a Python program in a sandbox (see the module docstring) with
    ``python`` (default: the worker's interpreter). Raises :class:`SandboxError` when the
    sandbox cannot start the program at all."""
    start = time.monotonic()
    py = interpreter(python)
    iso = isolation(py)
    _check_uid(iso)
    isolate_net = iso.network and not limits.network
    uid = fresh_uid() if iso.own_uid else None
    # RLIMIT_NPROC does not bind uid 0: there, new processes are refused by the filter instead
    no_fork = iso.seccomp and (limits.max_procs == 0 or (iso.root and uid is None))
    nproc = (limits.max_procs + 1 if uid is not None
             else _user_tasks(os.getuid()) + limits.max_procs + 1)
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 2
    rlimits = {"RLIMIT_CPU": max(1, cpu), "RLIMIT_AS": limits.memory_mb * 1024 * 1024,
               "RLIMIT_NPROC": nproc, "RLIMIT_FSIZE": limits.max_file_mb * 1024 * 1024,
               "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 256}
    unisolated = iso.missing() if not limits.network else tuple(
        m for m in iso.missing() if not m.startswith("no network"))
    work = Path(tempfile.mkdtemp(prefix="af-sandbox-"))
    try:
        script = work / "main.py"
        prelude = "" if (isolate_net or limits.network) else _NO_SOCKETS
        script.write_text(prelude + code)
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(work, 0o700)
            script.chmod(0o644)
        out_path, err_path = work / ".stdout", work / ".stderr"
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work),
               "TMPDIR": str(work), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            res = spawn(py, iso, script, rlimits=rlimits, timeout=limits.timeout_s, stdout=out,
                        stderr=err, env=env, uid=uid, isolate_net=isolate_net,
                        no_fork=no_fork, disk_mb=limits.disk_mb)
        STATS.count(unisolated=bool(unisolated), error=bool(res.errors))
        if res.errors:
            raise SandboxError(f"the sandbox could not start the code (python={py}): "
                               + "; ".join(res.errors))
        stdout, trunc_out = _read(out_path, limits.max_output_bytes)
        stderr, trunc_err = _read(err_path, limits.max_output_bytes)
        return SandboxResult(res.returncode, stdout, stderr, res.timed_out,
                             trunc_out or trunc_err, isolate_net, time.monotonic() - start,
                             unisolated)
    finally:
        shutil.rmtree(work, ignore_errors=True)
