"""astraflow/core/forkserver.py: a role forked from the server runs as ``python -m MODULE``
would (its own session, log, environment, signals and random seeds, its command line in ps),
its exit code reaches the launcher as Popen gives it, and a server that dies takes no role
with it; the launcher forks the role commands, each from the server of its kind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import alive, wait_for

from astraflow.core import forkserver
from astraflow.core.forkserver import ForkedProcess, ForkServer, ForkServerError
from astraflow.core.launcher import LAUNCHER_PID_ENV, Child, cli, role_env

HERE = Path(__file__).resolve().parent
PROBE = [sys.executable, "-m", "forked_probe"]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


class Probes(ForkServer):
    """A server whose probes are SIGKILLed when the test ends, passed or failed (a probe that
    waits for a signal would outlive a test that failed before sending it)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[ForkedProcess] = []

    def start(self, argv, env, log_path, *, cwd=None):  # type: ignore[no-untyped-def]
        proc = super().start(argv, env, log_path, cwd=cwd)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        self.started.clear()


@pytest.fixture(scope="module")
def probes() -> Iterator[Probes]:
    s = Probes()
    yield s
    s.close()


@pytest.fixture
def server(probes: Probes) -> Iterator[Probes]:
    yield probes
    probes.kill_all()


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(HERE), **extra}


def seen(log: Path, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if line.startswith("{"):
                return json.loads(line)
        time.sleep(0.05)
    raise AssertionError(f"the probe wrote nothing: {log.read_text() if log.exists() else ''}")


def server_pid(s: ForkServer) -> int:
    assert s._proc is not None
    return s._proc.pid


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_a_forked_module_runs_as_python_m_would(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    proc = server.start([*PROBE, "wait"], env(FORKED_PROBE_VALUE="x",
                                             **{LAUNCHER_PID_ENV: str(os.getpid())}),
                        log, cwd=str(tmp_path))
    s = seen(log)
    assert s["pid"] == proc.pid and s["sid"] == proc.pid  # a session of its own
    assert s["ppid"] == server_pid(server)
    # the server stands for the launcher: the role watches it (stop_when_orphaned)
    assert s["launcher"] == str(server_pid(server))
    assert s["env"] == "x" and s["cwd"] == str(tmp_path) and s["main"] == "__main__"
    assert s["argv"][1:] == ["wait"] and s["argv"][0].endswith("forked_probe.py")
    assert s["torch_loaded"]  # imported once, by the server
    assert s["sigint"] and s["sigterm"]  # as a fresh interpreter has them
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "-m forked_probe wait" in cmdline, cmdline
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 3 and proc.poll() == 3 and proc.returncode == 3


def test_siblings_draw_their_own_random_numbers(server: ForkServer, tmp_path: Path) -> None:
    procs = [server.start([*PROBE, "wait"], env(), tmp_path / f"{i}.log") for i in range(2)]
    a, b = (seen(tmp_path / f"{i}.log") for i in range(2))
    assert a["random"] != b["random"] and a["numpy"] != b["numpy"]
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(30) == -signal.SIGKILL  # as Popen reports a signal


def test_exit_codes_are_the_ones_popen_would_give(server: ForkServer, tmp_path: Path) -> None:
    assert server.start([*PROBE, "exit", "7"], env(), tmp_path / "a.log").wait(30) == 7
    assert "exiting with 7" in (tmp_path / "a.log").read_text()
    assert server.start([*PROBE, "raise"], env(), tmp_path / "b.log").wait(30) == 1
    assert "RuntimeError: the probe failed on purpose" in (tmp_path / "b.log").read_text()
    missing = server.start([sys.executable, "-m", "no_such_module_here"], env(),
                           tmp_path / "c.log")
    assert missing.wait(30) == 1
    assert "No module named no_such_module_here" in (tmp_path / "c.log").read_text()
    with pytest.raises(ForkServerError, match="-m MODULE"):
        server.start(["python3", "x.py"], env(), tmp_path / "d.log")


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_a_server_that_dies_takes_no_role_with_it(tmp_path: Path) -> None:
    s = Probes()
    request_cleanup = s.kill_all
    proc = s.start([*PROBE, "orphan"], env(**{LAUNCHER_PID_ENV: str(os.getpid())}),
                   tmp_path / "probe.log")
    seen(tmp_path / "probe.log")
    os.kill(server_pid(s), signal.SIGKILL)
    # the launcher hears that the server is gone and counts its role as ended...
    assert proc.wait(30) == -signal.SIGKILL
    # ...and the role, its parent gone, stops itself (its SIGTERM handler exits 3)
    wait_for(lambda: not alive(proc.pid), 30, "the role to end with its fork server")
    # a later start gets a new server
    assert s.start([*PROBE, "exit", "0"], env(), tmp_path / "again.log").wait(30) == 0
    request_cleanup()
    s.close()


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_the_launcher_forks_role_commands_from_the_server_of_their_kind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert forkserver.forkable(cli("rollout", "c.yaml")) == "torch"
    assert forkserver.forkable(cli("train")) == forkserver.forkable(cli("evaluate")) == "torch"
    assert forkserver.forkable(cli("produce", "c.yaml")) == "light"
    assert forkserver.forkable(cli("policy", "c.yaml", "post_rollout")) == "light"
    assert forkserver.forkable(cli("config", "show")) is None
    assert forkserver.forkable(["/usr/bin/python3", "-m", "astraflow.cli.app", "train"]) is None
    child = Child(tmp_path / "evaluate.log")
    proc = child.start(cli("evaluate", "--help"), role_env())
    assert isinstance(proc, ForkedProcess)
    assert child.reap(60) == 0 and "Usage" in child.tail(100)
    light = Child(tmp_path / "policy.log")
    assert isinstance(light.start(cli("policy", "--help"), role_env()), ForkedProcess)
    assert light.reap(60) == 0 and "Usage" in light.tail(100)
    # a log on a full disk (/dev/full: ENOSPC on every write): the banner is lost, the role is
    # forked all the same, and again (bench/chaos.py's disk_full fault stopped `astraflow run`
    # with ENOSPC here, flushing the banner before a restart)
    (tmp_path / "full.log").symlink_to("/dev/full")
    full = Child(tmp_path / "full.log")
    for _ in range(2):
        assert isinstance(full.start(cli("policy", "--help"), role_env()), ForkedProcess)
        assert full.reap(60) is not None  # it ran (its help text, refused, made it exit 1)
    # the light server never imported torch: its roles keep their small footprint
    light_server = forkserver.server("light")._proc
    assert light_server is not None
    maps = Path(f"/proc/{light_server.pid}/maps").read_text()
    assert "libtorch" not in maps
    other = Child(tmp_path / "config.log")
    assert isinstance(other.start(cli("config", "--help"), role_env()), subprocess.Popen)
    assert other.reap(60) == 0
    monkeypatch.setenv(forkserver.ENV, "0")
    fresh = Child(tmp_path / "fresh.log")
    assert isinstance(fresh.start(cli("evaluate", "--help"), role_env()), subprocess.Popen)
    assert fresh.reap(60) == 0 and "Usage" in fresh.tail(100)
