"""What the code sandbox can use on this host, found by trying it, and the one way it starts a
sandboxed program (:func:`spawn`, used by the probes and by :func:`.sandbox.run_python`)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from astraflow.consumers.rollout.rewards import sandbox_seccomp
from astraflow.core.errors import AstraflowError

log = logging.getLogger("astraflow.rollout.sandbox")

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
# the host directories a sandbox sees (read-only), besides the interpreter's own; everything
# else (home directories, the run directory, the worker's working directory, /tmp, /var,
# /opt, /mnt, /run, /srv, /sys) is simply not there
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
INODES = 16_384  # files and directories the sandbox's tmpfs may hold
_UID_BASE = 1_900_000_000
_uids = itertools.count()


class SandboxError(AstraflowError):
    """The sandbox cannot run code: its interpreter does not start, or setting up the
    isolation failed. Raised instead of returning a failed result, so that a broken setup is
    never scored as wrong code."""


@dataclass(frozen=True, slots=True)
class Isolation:
    """What contains sandboxed code on this host, for one interpreter (probed once)."""

    namespaces: bool = False  # PID, mount, IPC, UTS namespaces: a root of its own, quota'd
    readonly: bool = False  # the system directories are read-only with every submount
    network: bool = False  # an empty network namespace
    seccomp: bool = False  # the filter of sandbox_seccomp
    own_uid: bool = False  # root: runs as a uid of its own (else the worker's, no capabilities)
    root: bool = False  # the worker runs as root
    reach: tuple[str, ...] = ()  # the interpreter's directories (visible read-only)
    system: tuple[str, ...] = SYSTEM  # host directories visible read-only

    def missing(self) -> tuple[str, ...]:
        """What this host cannot isolate, each with what it means (empty: all of it)."""
        out = []
        if not self.namespaces:
            out.append("no PID/mount namespaces: processes the code starts can outlive it, "
                       "it sees the host's processes and files (the run directory, home "
                       "directories) and has no disk quota")
        elif not self.readonly:
            out.append("submounts of the system directories stay writable (mount_setattr, "
                       "Linux 5.12+)")
        if not self.network:
            out.append("no network namespace: sockets are blocked inside Python only (best "
                       "effort)")
        if not self.seccomp:
            out.append("no seccomp filter: setns, ptrace, mount, bpf, io_uring and foreign "
                       "syscall ABIs are not blocked")
        if self.root and not self.own_uid:
            out.append("runs as uid 0 (capabilities dropped): it can read root-owned files "
                       "it sees" + ("" if self.seccomp else ", and start processes without "
                                    "limit"))
        elif not self.own_uid:
            out.append("runs as the worker's own uid (the worker is not root): it can read "
                       "and write that user's files it sees")
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Spawned:
    returncode: int  # negative: killed by that signal
    timed_out: bool
    errors: tuple[str, ...]  # setup failures the launcher reported (empty: the program ran)


def fresh_uid() -> int:
    return _UID_BASE + (os.getpid() % 100_000) * 100 + next(_uids) % 100


def spawn(python: str, iso: Isolation, script: Path, *, rlimits: dict[str, int],
          timeout: float, stdout: Any, stderr: Any, env: dict[str, str], uid: int | None,
          isolate_net: bool, no_fork: bool, disk_mb: int) -> Spawned:
    """Run ``python -I -B script`` under ``iso`` through the launcher; kill it (and, with
    namespaces, everything it started) at ``timeout`` seconds."""
    work = script.parent
    status_r, status_w = os.pipe()
    cfg = {"python": python, "script": str(script), "work": str(work),
           "namespaces": iso.namespaces, "readonly": iso.readonly, "isolate_net": isolate_net,
           "userns": not iso.root, "uid": uid, "reach": list(iso.reach),
           "system": list(iso.system), "disk_mb": disk_mb, "inodes": INODES, "rlimits": rlimits,
           "seccomp": iso.seccomp, "no_fork": no_fork,
           "own_pid": iso.seccomp and not iso.namespaces, "status_fd": status_w}
    timed_out = False
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)], cwd=work, env=env,
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
            pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if uid is not None and not iso.namespaces:  # what left the process group dies too
            for _ in range(10):
                if not _kill_uid(uid):
                    break
                time.sleep(0.01)
        text = _read_all(status_r, deadline=time.monotonic() + 5.0)
    finally:
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
    errors = tuple(line[len("error: "):] for line in text.splitlines()
                   if line.startswith("error: "))
    return Spawned(proc.returncode, timed_out, errors)


def _read_all(fd: int, *, deadline: float) -> str:
    """What the launcher's processes wrote on the status pipe, until they all closed it."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _kill_uid(uid: int) -> int:
    """SIGKILL every process whose real uid is ``uid``; returns how many were signalled."""
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            os.kill(int(entry.name), signal.SIGKILL)
                            killed += 1
                        break
        except (OSError, ValueError):
            continue
    return killed


# --- probing ---------------------------------------------------------------------------------
_INFO = """\
import json, os, sys
print(json.dumps({"prefix": sys.prefix, "prefixes": sorted({sys.prefix, sys.base_prefix,
    sys.exec_prefix, sys.base_exec_prefix}), "path": [p for p in sys.path if os.path.isdir(p)],
    "uid": os.getuid(), "probe": MARK}))
"""


def interpreter(python: str | None) -> str:
    """The absolute path of ``python`` (None: the worker's own), symlinks kept: a venv's
    python finds its venv through the path it was started by."""
    if python is None:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else python
    if found is None:
        raise SandboxError(f"sandbox interpreter {python!r} not found on PATH; give a path "
                           "(the code reward's `python` keyword argument)")
    return os.path.abspath(found)


def interpreter_info(python: str) -> dict[str, Any]:
    """Its prefixes and import path, from running it directly (no sandbox)."""
    try:
        res = subprocess.run([python, "-I", "-c", _INFO.replace("MARK", "0")],
                             capture_output=True, text=True, timeout=60, check=False)
        info = json.loads(res.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
    else:
        if res.returncode == 0 and isinstance(info, dict):
            return info
        why = f"exit status {res.returncode}"
    raise SandboxError(
        f"cannot run the sandbox's interpreter {python} ({why}; it must be a Python 3 "
        "interpreter); set the code reward's `python` keyword argument "
        "(rollout.reward.kwargs.python) to one that runs, e.g. /usr/bin/python3")


def reach_of(python: str, info: dict[str, Any]) -> tuple[str, ...]:
    """The directories the interpreter needs: its prefixes and every directory its symlink
    chain passes through; outermost only."""
    dirs = {os.path.realpath(p) for p in info["prefixes"]}
    path, seen = python, 0
    while seen < 40:
        dirs.add(os.path.dirname(path))
        dirs.add(os.path.realpath(os.path.dirname(path)))
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
        seen += 1
    out: list[str] = []
    for d in sorted(dirs, key=len):
        if d != "/" and not any(d == o or d.startswith(o + "/") for o in out):
            out.append(d)
    return tuple(sorted(out))


def probe(python: str) -> Isolation:
    """The most isolation that runs ``python`` correctly here (it imports what it imports
    outside the sandbox). Raises :class:`SandboxError` when not even a bare run works."""
    info = interpreter_info(python)
    reach = reach_of(python, info)
    base = Isolation(root=os.geteuid() == 0, reach=reach)
    if not sys.platform.startswith("linux"):
        return _must_work(python, base, info)
    cand = base
    for step in (dict(namespaces=True, readonly=True, network=True),
                 dict(namespaces=True, network=True), dict(network=True)):
        trial = replace(base, **step)  # type: ignore[arg-type]
        if _works(python, trial, info):
            cand = trial
            break
    if sandbox_seccomp.supported(platform.machine()):
        cand = _better(python, cand, info, seccomp=True)
    if cand.root:
        cand = _better(python, cand, info, own_uid=True)
    return _must_work(python, cand, info)


def _better(python: str, cand: Isolation, info: dict[str, Any], **more: bool) -> Isolation:
    trial = replace(cand, **more)  # type: ignore[arg-type]
    return trial if _works(python, trial, info) else cand


def _must_work(python: str, iso: Isolation, info: dict[str, Any]) -> Isolation:
    why = _try(python, iso, info)
    if why:
        raise SandboxError(f"the sandbox cannot run {python} on this host even without "
                           f"isolation: {why}")
    return iso


def _works(python: str, iso: Isolation, info: dict[str, Any]) -> bool:
    why = _try(python, iso, info)
    if why:
        log.debug("sandbox probe failed python=%s isolation=%s why=%s", python, iso, why)
    return not why


def _try(python: str, iso: Isolation, info: dict[str, Any]) -> str:
    """Run the probe under ``iso``; what went wrong ('' when it ran as it does outside)."""
    mark = os.urandom(8).hex()
    uid = fresh_uid() if iso.own_uid else None
    work = Path(tempfile.mkdtemp(prefix="af-sandbox-probe-"))
    try:
        script = work / "probe.py"
        script.write_text("import threading\nt = threading.Thread(target=int)\nt.start()\n"
                          "t.join()\n" + _INFO.replace("MARK", repr(mark)))
        if uid is not None:
            os.chown(work, uid, uid)
        with open(work / ".out", "w+b") as out, open(work / ".err", "w+b") as err:
            res = spawn(python, iso, script, rlimits={}, timeout=30.0, stdout=out, stderr=err,
                        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, uid=uid,
                        isolate_net=iso.network, no_fork=False, disk_mb=8)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read(2000).decode(
                errors="replace")
        if res.errors:
            return "; ".join(res.errors)
        if res.returncode != 0:
            return f"exit status {res.returncode}: {stderr.strip()[-500:]}"
        try:
            got = json.loads(stdout)
        except ValueError:
            return f"unexpected output {stdout[:200]!r}"
        if got.get("probe") != mark or got.get("prefix") != info["prefix"]:
            return f"runs another interpreter (sys.prefix {got.get('prefix')!r})"
        lost = [p for p in info["path"] if p not in got["path"]
                and any(p == r or p.startswith(r + "/") for r in iso.reach)]
        if lost:
            return f"cannot read {lost[0]} in the sandbox"
        if uid is not None and got.get("uid") != uid:
            return f"runs as uid {got.get('uid')}, not {uid}"
        return ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
