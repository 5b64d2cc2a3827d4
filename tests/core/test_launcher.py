"""The one launcher of role processes (astraflow/core/launcher.py): a child in a session of its
own with one log across restarts, an environment naming its launcher, stopped by SIGTERM then
SIGKILL after the grace; and the scaler's local actuator launching through it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_for

from astraflow.core.launcher import LAUNCHER_PID_ENV, Child, role_env, stop_all
from astraflow.core.metrics import PORT_ENV

#: prints what it sees, then runs until SIGTERM (exit 0) or, with "ignore", until SIGKILL
CHILD = """
import os, signal, sys, time
print("env", os.environ.get(sys.argv[1], "unset"), os.environ.get(sys.argv[2], "unset"),
      os.getsid(0) == os.getpid(), flush=True)
if sys.argv[3] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("up", flush=True)
while True:
    time.sleep(0.05)
"""


def argv(mode: str = "drain") -> list[str]:
    return [sys.executable, "-c", CHILD, LAUNCHER_PID_ENV, PORT_ENV, mode]


def wait_up(child: Child, count: int = 1, timeout: float = 30.0) -> None:
    wait_for(lambda: child.tail(100).splitlines().count("up") >= count, timeout,
             lambda: f"'up' in the child's log: {child.tail()!r}", every=0.02)


def test_a_child_names_its_launcher_has_its_own_session_and_one_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_ENV, "9999")  # the launcher's own port: never inherited
    child = Child(tmp_path / "logs" / "r.log")
    child.start(argv(), role_env())
    wait_up(child)
    assert f"env {os.getpid()} unset True" in child.tail()
    first = child.pid
    assert child.stop(10) == 0 and not child.running()
    child.start(argv(), role_env(), metrics_port=20001)  # a restart: same log, appended
    wait_up(child, 2)
    assert child.pid != first
    lines = child.tail(100).splitlines()
    assert sum(line.startswith("=== start") for line in lines) == 2
    assert f"env {os.getpid()} 20001 True" in lines
    assert child.stop(10) == 0
    child.close()


def test_stop_all_kills_what_ignores_sigterm_after_one_grace(tmp_path: Path) -> None:
    polite, stubborn = Child(tmp_path / "a.log"), Child(tmp_path / "b.log")
    polite.start(argv(), role_env())
    stubborn.start(argv("ignore"), role_env())
    wait_up(polite)
    wait_up(stubborn)
    killed: list[Child] = []
    t0 = time.monotonic()
    codes = stop_all([polite, stubborn, Child(tmp_path / "never.log")], 0.5, killed.append)
    assert codes == [0, -signal.SIGKILL, None]
    assert killed == [stubborn]
    assert time.monotonic() - t0 < 10


def test_the_local_actuator_launches_children_that_watch_it(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from astraflow.consumers.scaler.local import LocalActuator

    monkeypatch.setenv(PORT_ENV, "9999")
    act = LocalActuator(argv=lambda n: argv(), out=tmp_path, grace_s=5)
    try:
        assert act.scale(1, 0).ok
        log = tmp_path / "logs" / "scaled-rollout-0.log"
        wait_for(lambda: "up" in log.read_text().splitlines(), 30,
                 lambda: f"'up' in the log: {log.read_text()!r}", every=0.02)
        # it names this process its launcher (a child stops itself if this process dies),
        # and no child takes the launcher's metrics port
        assert f"env {os.getpid()} unset True" in log.read_text()
    finally:
        act.close()
    assert act.exit_codes == {0: 0}
