"""astraflow/core/launcher.py's stop_when_orphaned: a role whose launcher died with SIGKILL stops
itself with its own SIGTERM handling; a role started by hand, and the processes a role starts,
are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from waiting import alive, eventually, wait_for

from astraflow.core.launcher import LAUNCHER_PID_ENV

# a role: watches its launcher, says on SIGTERM that it stopped, starts a child of its own
# (which must not inherit the watch) and writes that child's view of the variable
ROLE = f'''
import os, signal, subprocess, sys, time
from pathlib import Path
from astraflow.core.launcher import stop_when_orphaned
out = Path(sys.argv[1])
def stop(*_):
    (out / "stopped").write_text(str(os.getpid()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
stop_when_orphaned(0.1)
child = subprocess.run([sys.executable, "-c",
                        "import os; print(os.environ.get({LAUNCHER_PID_ENV!r}, 'unset'))"],
                       capture_output=True, text=True)
(out / "child-env").write_text(child.stdout.strip())
(out / "started").write_text(str(os.getpid()))
time.sleep(120)
'''

# a launcher: starts the role in a session of its own, as the supervisor does, then waits
LAUNCHER = '''
import os, subprocess, sys, time
env = {**os.environ}
if sys.argv[2] == "watched":
    env[sys.argv[3]] = str(os.getpid())
role = subprocess.Popen([sys.executable, "-c", sys.argv[4], sys.argv[1]], env=env,
                        start_new_session=True)
print(role.pid, flush=True)
time.sleep(120)
'''


def _launch(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), mode, LAUNCHER_PID_ENV, ROLE],
        stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    role = int(launcher.stdout.readline())
    wait_for((tmp_path / "started").exists, 60, "the role to start")
    return launcher, role


def _gone(pid: int, within: float) -> bool:
    """Whether ``pid`` has ended, or ends within ``within`` seconds."""
    return eventually(lambda: not alive(pid), within, every=0.05)


def test_a_role_stops_itself_once_its_launcher_is_killed(tmp_path: Path) -> None:
    launcher, role = _launch(tmp_path, "watched")
    try:
        assert (tmp_path / "child-env").read_text() == "unset"  # its own children don't watch
        time.sleep(0.5)
        assert not (tmp_path / "stopped").exists()  # not while the launcher lives
        launcher.kill()
        launcher.wait(10)
        assert _gone(role, 30), "the role outlived its launcher"
        assert (tmp_path / "stopped").read_text() == str(role)  # through its SIGTERM handler
    finally:
        launcher.kill()
        if alive(role):
            os.kill(role, signal.SIGKILL)


def test_a_role_started_by_hand_is_left_alone(tmp_path: Path) -> None:
    launcher, role = _launch(tmp_path, "by-hand")
    try:
        launcher.kill()
        launcher.wait(10)
        assert not _gone(role, 2), "a role with no launcher to watch stopped"
        assert not (tmp_path / "stopped").exists()
    finally:
        launcher.kill()
        if alive(role):
            os.kill(role, signal.SIGKILL)


def test_a_role_whose_launcher_died_while_it_started_stops_at_once(tmp_path: Path) -> None:
    """The variable names a process that is not (any more) this role's parent."""
    role = subprocess.Popen([sys.executable, "-c", ROLE, str(tmp_path)],
                            env={**os.environ, LAUNCHER_PID_ENV: "1"},
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = role.communicate(timeout=60)
    finally:
        role.kill()
    assert role.returncode == 0 and (tmp_path / "stopped").exists(), err
    assert not (tmp_path / "started").exists()
    assert "the launcher of this role (astraflow run, pid 1) is gone" in err
