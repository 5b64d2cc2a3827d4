"""Run untrusted Python in a contained subprocess (the ``code`` reward, the ``python`` tool).

What contains it (:class:`SandboxLimits`):

* **time**: a wall-clock timeout, after which the whole process group is killed, and
  ``RLIMIT_CPU`` (CPU seconds) as a second line;
* **memory**: ``RLIMIT_AS`` (address space);
* **processes**: ``RLIMIT_NPROC``. The limit counts every process of the user, so when the
  worker runs as root each sandbox runs as a fresh unprivileged uid of its own (a fork bomb then
  stops at ``max_procs`` and every process of that uid is killed afterwards, even ones that left
  the process group). As an ordinary user the limit is the user's current process count plus
  ``max_procs``, and only the process group is killed at the end;
* **output**: stdout and stderr go to files capped by ``RLIMIT_FSIZE`` (the process is killed
  by SIGXFSZ past it) and are read back up to ``max_output_bytes``; files it writes are capped the
  same way, in a private temporary directory that is deleted afterwards;
* **network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; as an ordinary user
  together with a user namespace) where the kernel allows it. Where it does not, sockets are
  disabled inside Python before the code runs, which is best effort only (``ctypes`` or a
  subprocess gets around it): :func:`network_isolation` says which applies.

This is containment of accidents and of a policy's bad habits (infinite loops, fork bombs, huge
prints, stray network calls), not a security boundary against a determined attacker: the code
runs on the host's kernel and file system (read access to world-readable files remains). Use a
container or VM runtime for that.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("astraflow.rollout.sandbox")

_LAUNCHER = r"""
import ctypes, json, os, platform, resource, struct, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
if cfg["isolate_net"]:
    flags = 0x40000000  # CLONE_NEWNET
    if os.geteuid() != 0:
        flags |= 0x10000000  # CLONE_NEWUSER: lets an unprivileged user own a net namespace
    if libc.unshare(flags) != 0:
        sys.stderr.write("sandbox: cannot isolate the network (errno %d)\n" % ctypes.get_errno())
        os._exit(125)
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["no_fork"]:
    # seccomp filter: new processes fail with EAGAIN (threads are allowed); clone3 says ENOSYS
    # so that libc falls back to clone, whose flags the filter can read.
    arch, nrs = {"x86_64": (0xC000003E, (435, 57, 58, 56)),
                 "aarch64": (0xC00000B7, (435, 0xFFFFFFFF, 0xFFFFFFFF, 220))}[platform.machine()]
    clone3, fork, vfork, clone = nrs
    ALLOW, EAGAIN, ENOSYS = 9, 10, 11
    def jump(pc, k, t, f):
        return (0x15, t - pc - 1, f - pc - 1, k)
    prog = [(0x20, 0, 0, 4), jump(1, arch, 2, ALLOW), (0x20, 0, 0, 0),
            jump(3, clone3, ENOSYS, 4), jump(4, fork, EAGAIN, 5), jump(5, vfork, EAGAIN, 6),
            jump(6, clone, 7, ALLOW), (0x20, 0, 0, 16), (0x45, ALLOW - 9, EAGAIN - 9, 0x10000),
            (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050000 | 11), (0x06, 0, 0, 0x00050000 | 38)]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw)
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Prog(len(prog), ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        sys.stderr.write("sandbox: cannot install the seccomp filter (errno %d)\n"
                         % ctypes.get_errno())
        os._exit(125)
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
os.execv(sys.executable, [sys.executable, "-I", "-B", cfg["script"]])
"""

_NO_SOCKETS = """\
import socket as _af_socket
def _af_blocked(*_a, **_k):
    raise PermissionError("network access is disabled in the astraflow sandbox")
for _af_name in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
    setattr(_af_socket, _af_name, _af_blocked)
del _af_socket, _af_blocked, _af_name
"""

_UID_BASE = 1_900_000_000
_uids = itertools.count()
_probe_lock = threading.Lock()
_features: dict[str, bool] | None = None


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    cpu_s: int | None = None  # RLIMIT_CPU; default: the timeout rounded up, plus 2
    memory_mb: int = 1024  # RLIMIT_AS
    max_procs: int = 16  # processes (and threads) the code may add; 0: no new processes
    max_file_mb: int = 16  # RLIMIT_FSIZE: any file, stdout and stderr included
    max_output_bytes: int = 64 * 1024  # of stdout/stderr read back
    network: bool = False  # True: leave the network alone


@dataclass(frozen=True, slots=True)
class SandboxResult:
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    network_isolated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def features() -> dict[str, bool]:
    """What this host offers sandboxes, probed once per process: ``network`` (an empty network
    namespace), ``seccomp`` (the no-new-processes filter), ``drop_uid`` (running as root with
    an interpreter other users can run, so each sandbox gets a uid of its own)."""
    global _features
    with _probe_lock:
        if _features is None:
            _features = {"network": _probe(isolate_net=True),
                         "seccomp": _probe(no_fork=True),
                         "drop_uid": os.geteuid() == 0 and _others_can_run(sys.executable)}
            if not _features["network"]:
                log.warning("sandbox: no network namespace available (unshare refused); "
                            "network is blocked inside Python only, best effort")
        return dict(_features)


def network_isolation() -> bool:
    """Whether sandboxes get an empty network namespace here."""
    return features()["network"]


def _others_can_run(executable: str) -> bool:
    """Whether a user other than the owner can execute ``executable`` and read its library."""
    import stat

    paths = [Path(os.path.realpath(executable)), Path(sys.base_prefix).resolve() / "lib"]
    for path in paths:
        for p in [path, *path.parents]:
            try:
                mode = p.stat().st_mode
            except OSError:
                return False
            if not mode & stat.S_IXOTH:
                return False
    return True


def _probe(*, isolate_net: bool = False, no_fork: bool = False) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    if no_fork and platform.machine() not in ("x86_64", "aarch64"):
        return False
    with tempfile.TemporaryDirectory(prefix="af-sandbox-probe-") as d:
        script = Path(d) / "probe.py"
        script.write_text("import threading\nt = threading.Thread(target=print)\nt.start()\n"
                          "t.join()\n")
        cfg = {"isolate_net": isolate_net, "no_fork": no_fork, "rlimits": {}, "uid": None,
               "script": str(script)}
        try:
            res = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, json.dumps(cfg)],
                                 capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return res.returncode == 0


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


def _read(path: Path, limit: int) -> tuple[str, bool]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return "", False
    return data.decode("utf-8", "replace"), size > limit


def run_python(code: str, *, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` as a Python program in a sandbox; see the module docstring."""
    start = time.monotonic()
    feats = features()
    isolate = not limits.network and feats["network"]
    root = os.geteuid() == 0
    uid = (_UID_BASE + (os.getpid() % 100_000) * 100 + next(_uids) % 100
           if feats["drop_uid"] else None)
    # RLIMIT_NPROC binds unless we are root and stay root; then new processes are refused
    # outright by the seccomp filter instead
    no_fork = feats["seccomp"] and (limits.max_procs == 0 or (root and uid is None))
    nproc = (limits.max_procs + 1 if uid is not None
             else _user_tasks(os.getuid()) + limits.max_procs + 1)
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 2
    rlimits = {
        "RLIMIT_CPU": max(1, cpu),
        "RLIMIT_AS": limits.memory_mb * 1024 * 1024,
        "RLIMIT_NPROC": nproc,
        "RLIMIT_FSIZE": limits.max_file_mb * 1024 * 1024,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": 256,
    }
    work = Path(tempfile.mkdtemp(prefix="af-sandbox-"))
    try:
        script = work / "main.py"
        prelude = "" if (isolate or limits.network) else _NO_SOCKETS
        script.write_text(prelude + code)
        if uid is not None:
            os.chown(work, uid, uid)
            os.chmod(work, 0o700)
            script.chmod(0o644)
        out_path, err_path = work / ".stdout", work / ".stderr"
        cfg = {"isolate_net": isolate, "no_fork": no_fork, "rlimits": rlimits, "uid": uid,
               "script": str(script)}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work),
               "TMPDIR": str(work), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _LAUNCHER, json.dumps(cfg)], cwd=work, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if uid is not None:  # anything that left the process group dies too
            for _ in range(10):
                if not _kill_uid(uid):
                    break
                time.sleep(0.01)
        stdout, trunc_out = _read(out_path, limits.max_output_bytes)
        stderr, trunc_err = _read(err_path, limits.max_output_bytes)
        return SandboxResult(proc.returncode, stdout, stderr, timed_out, trunc_out or trunc_err,
                             isolate, time.monotonic() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
