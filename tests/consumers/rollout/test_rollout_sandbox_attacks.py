"""The code sandbox under attack (docs/results/faults.md#limits-and-hardening): each test
runs the attack for real and asserts it fails. Found when the worker ran as root with its interpreter in a directory other users
cannot enter (a venv under /root): the code then ran as uid 0.

The attacks only ever aim at things the test made for the purpose (a planted variable, a
victim process, a directory, a listening socket), so a sandbox that lets one through harms
nothing else on the machine. Each runs with what the host offers (``probed``) and, for a root
worker, also in the fallback for an interpreter no other user can run (``uid0``: uid 0 with
every capability dropped, which the config must accept: ``rollout.sandbox.allow_same_uid``)."""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from astraflow.consumers.rollout.rewards import sandbox, score
from astraflow.consumers.rollout.rewards.base import REWARDS
from astraflow.consumers.rollout.rewards.sandbox import (
    SandboxError,
    SandboxLimits,
    features,
    isolation,
    run_python,
)

LIMITS = SandboxLimits(timeout_s=20.0)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the sandbox's isolation is Linux-only")
pytestmark = linux_only


@pytest.fixture(params=["probed", "uid0"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "uid0":
        iso = isolation()
        if not (iso.root and iso.namespaces):
            pytest.skip("the uid-0 fallback is that of a root worker with namespaces")
        monkeypatch.setitem(sandbox._isolation, sys.executable, replace(iso, own_uid=False))
        monkeypatch.setattr(sandbox.POLICY, "allow_same_uid", True)
    return str(request.param)


def _pids_with(token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"{entry.path}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the worker's user that the sandbox must not be able to signal."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def test_sandbox_cannot_read_the_workers_environment(mode: str) -> None:
    """A worker started with an API key in its environment (as a deployment passes secrets)
    runs code that looks for it everywhere it might be."""
    secret = f"af-secret-{uuid.uuid4().hex}"
    code = f"""
import os
hits = [k for k, v in os.environ.items() if {secret!r} in v]
for pid in [os.getppid(), 1] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        with open(f'/proc/{{pid}}/environ', 'rb') as f:
            if {secret!r}.encode() in f.read():
                hits.append(pid)
    except OSError:
        pass
print('found' if hits else 'clean', hits)
"""
    worker = ("import sys\n"
              "from dataclasses import replace\n"
              "from astraflow.consumers.rollout.rewards import sandbox as sb\n"
              f"if {mode!r} == 'uid0':\n"
              "    sb._isolation[sys.executable] = replace(sb.isolation(), own_uid=False)\n"
              "    sb.configure(allow_same_uid=True)\n"
              "res = sb.run_python(sys.stdin.read(), limits=sb.SandboxLimits(timeout_s=20.0))\n"
              "print(res.returncode, res.stdout, res.stderr)\n")
    out = subprocess.run([sys.executable, "-c", worker], input=code, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "AF_TEST_API_KEY": secret},
                         check=True).stdout
    assert out.startswith("0 clean"), out
    assert secret not in out


def test_sandbox_cannot_signal_the_worker_or_its_processes(
        victim: subprocess.Popen[bytes], mode: str) -> None:
    code = f"""
import os, signal
for name, pid, sig in (('victim', {victim.pid}, signal.SIGKILL), ('worker', {os.getpid()}, 0)):
    try:
        os.kill(pid, sig)
        print(name, 'signalled')
    except OSError as e:
        print(name, 'refused', e.errno)
"""
    res = run_python(code, limits=LIMITS)
    assert res.ok, res.stderr
    assert "signalled" not in res.stdout, res.stdout
    assert victim.poll() is None  # still running


def test_sandbox_cannot_write_outside_its_directory(tmp_path: Path, mode: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Even where the target is visible (here a directory is bound into the sandbox on
    purpose, as the interpreter's are), the file system is read-only to the code but for its
    own directory."""
    iso = isolation()
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    monkeypatch.setitem(sandbox._isolation, sys.executable,
                        replace(iso, reach=(*iso.reach, str(outside))))
    existing = outside / "model.bin"
    existing.write_text("weights")
    existing.chmod(0o644)
    code = f"""
print('saw', open({str(existing)!r}).read())  # the target is there to be written
for path in ({str(existing)!r}, {str(outside / 'planted.py')!r}):
    try:
        with open(path, 'w') as f:
            f.write('owned')
        print('wrote', path)
    except OSError as e:
        print('refused', path, e.errno)
"""
    res = run_python(code, limits=LIMITS)
    assert res.ok, res.stderr
    assert res.stdout.startswith("saw weights"), res.stdout
    assert "wrote" not in res.stdout, res.stdout
    assert existing.read_text() == "weights" and not (outside / "planted.py").exists()


def test_sandbox_descendants_die_with_it(mode: str) -> None:
    """A child that starts a session of its own (leaving the process group the timeout
    kills) and sleeps must not outlive the sandbox."""
    token = f"af-survivor-{uuid.uuid4().hex}"
    code = f"""
import os, sys
r, w = os.pipe()
try:
    pid = os.fork()
except OSError as e:
    print('fork refused', e.errno)
    raise SystemExit(0)
if pid == 0:
    os.setsid()
    os.write(w, b'x')
    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)  # {token}'])
os.read(r, 1)
print('forked', pid)
"""
    try:
        res = run_python(code, limits=LIMITS)
        assert res.ok, res.stderr
        if features()["drop_uid"] or os.geteuid() != 0:
            assert res.stdout.startswith("forked"), res.stdout  # the attack really ran
        deadline = time.monotonic() + 10
        while _pids_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _pids_with(token) == []
    finally:
        for pid in _pids_with(token):  # an old sandbox leaves one behind: don't leak it
            os.kill(pid, signal.SIGKILL)


_I386_FORK = "bytes([0xB8, 2, 0, 0, 0, 0xCD, 0x80, 0xC3])"  # mov eax, 2 (fork); int 0x80; ret


@pytest.mark.skipif(platform.machine() != "x86_64",
                    reason="the 32-bit syscall ABI (int 0x80) exists on x86_64 only")
def test_sandbox_kills_a_fork_through_the_32_bit_syscall_abi(mode: str) -> None:
    if not features()["seccomp"]:
        pytest.skip("no seccomp filter on this host")
    code = f"""
import ctypes, mmap, os
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write({_I386_FORK})
fork32 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
print('calling', flush=True)
pid = fork32()
if pid == 0:
    print('child survived', flush=True)
    os._exit(0)
print('forked', pid, flush=True)
"""
    res = run_python(code, limits=LIMITS)
    assert res.stdout.startswith("calling"), res.stdout + res.stderr  # the attack really ran
    assert "forked" not in res.stdout and "child" not in res.stdout, res.stdout
    assert res.returncode == -signal.SIGSYS  # the filter kills the process outright


def test_sandbox_cannot_rejoin_the_network(mode: str) -> None:
    if not features()["network"]:
        pytest.skip("no network namespace on this host (sockets are blocked in Python only)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        code = f"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
for name, pid in (('worker', {os.getpid()}), ('init', 1), ('self', os.getpid())):
    try:
        fd = os.open(f'/proc/{{pid}}/ns/net', os.O_RDONLY)
    except OSError as e:
        print('open', name, 'refused', e.errno)
        continue
    rc = libc.setns(fd, 0x40000000)
    print('setns', name, 'joined' if rc == 0 else 'refused', ctypes.get_errno())
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()
    print('connected')
except OSError as e:
    print('no network', e.errno)
"""
        res = run_python(code, limits=LIMITS)
    assert res.ok, res.stderr
    assert "connected" not in res.stdout and "joined" not in res.stdout, res.stdout
    # its own namespace file is there to open; joining it is refused all the same
    assert f"setns self refused {errno.EPERM}" in res.stdout, res.stdout


def test_correct_code_scores_one_with_the_workers_interpreter() -> None:
    """The venv's python, wherever it lives (here possibly under a private /root), runs the
    code; as root, under a uid of its own."""
    res = run_python("import os\nprint(os.getuid())\n", limits=LIMITS)
    assert res.ok, res.stderr
    if os.geteuid() == 0 and features()["drop_uid"]:
        assert int(res.stdout) != 0
    fn = REWARDS.resolve("code")
    out = fn("```python\ndef add(a, b):\n    return a + b\n```", {"tests": "assert add(2, 3) == 5"},
             timeout_s=20)
    assert out["reward"] == 1.0


@pytest.fixture
def private_venv(tmp_path: Path) -> Path:
    """A venv in a directory only its owner may enter (like one under /root), on a system
    python whose own files everyone may read."""
    base = shutil.which("python3", path="/usr/bin:/bin")
    if base is None:
        pytest.skip("no system python3 to build a venv from")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    venv = private / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def test_correct_code_scores_one_with_a_venv_in_a_private_directory(
        private_venv: Path) -> None:
    res = run_python("import sys\nprint(sys.prefix)\n", limits=LIMITS, python=str(private_venv))
    assert res.ok, res.stderr
    assert res.stdout.strip() == str(private_venv.parent.parent)  # the venv, not the base
    out = REWARDS.resolve("code")("def f():\n    return 1\n", {"tests": "assert f() == 1"},
                                  timeout_s=20, python=str(private_venv))
    assert out["reward"] == 1.0


def test_an_unusable_interpreter_is_an_error_not_a_zero(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(SandboxError, match="cannot run") as info:
        run_python("print(1)", limits=LIMITS, python=str(broken))
    assert str(broken) in str(info.value)
    # through the worker's fault isolation it is a counted reward failure, not a silent 0
    s = asyncio.run(score(REWARDS.resolve("code"), "print(1)", {"tests": ""},
                          timeout_s=20, python=str(broken)))
    assert s.failed and "SandboxError" in (s.error or "")


def test_a_host_that_cannot_isolate_is_warned_about_once_and_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Where namespaces are refused (a restricted container), the code still runs, with one
    warning that says what is missing, and every such run is counted and marked."""
    probed = isolation()
    bare = replace(probed, namespaces=False, readonly=False, network=False, own_uid=False)
    monkeypatch.setattr(sandbox, "probe", lambda python: bare)
    monkeypatch.setattr(sandbox.POLICY, "allow_same_uid", True)  # uid 0 / the worker's uid
    monkeypatch.delitem(sandbox._isolation, sys.executable)
    before = sandbox.STATS.unisolated_runs
    with caplog.at_level("WARNING", logger="astraflow.rollout.sandbox"):
        res = run_python("print('ran')\n", limits=LIMITS)
        out = REWARDS.resolve("code")("x = 1\n", {"tests": "assert x == 1"}, timeout_s=20)
    assert res.ok and res.stdout == "ran\n"
    assert any("PID/mount namespaces" in m for m in res.unisolated)
    assert out["reward"] == 1.0 and out["sandbox_unisolated"] == 1.0
    assert sandbox.STATS.unisolated_runs == before + 2
    warnings = [r for r in caplog.records if "cannot fully isolate" in r.getMessage()]
    assert len(warnings) == 1 and "no network namespace" in warnings[0].getMessage()


def test_a_fully_isolating_host_marks_nothing() -> None:
    if sandbox.missing():
        pytest.skip(f"this host cannot isolate fully: {sandbox.missing()}")
    out = REWARDS.resolve("code")("x = 1\n", {"tests": "assert x == 1"}, timeout_s=20)
    assert out["reward"] == 1.0 and out["sandbox_unisolated"] == 0.0
