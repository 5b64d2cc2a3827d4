"""The supervisor with real processes: restart of a killed role, terminal roles, stop."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from waiting import wait_for

from astraflow.run.supervisor import RoleSpec, Supervisor


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_killed_role_is_restarted_and_terminal_role_ends_the_phase(tmp_path: Path) -> None:
    flag = tmp_path / "go"
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=2, grace_s=5, on_event=events.append)
    sup.start([
        RoleSpec("worker", py("import time\nprint('up', flush=True)\nwhile True: time.sleep(0.1)")),
        RoleSpec("trainer", py(f"import os, time\nwhile not os.path.exists({str(flag)!r}): "
                               "time.sleep(0.05)\nprint('done')"), terminal=True),
    ])
    assert sup.check() is True
    first = sup.roles["worker"].proc
    assert first is not None
    wait_for(lambda: "up" in sup.roles["worker"].tail())
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and sup.roles["worker"].restarts == 1)
    assert sup.roles["worker"].proc is not first
    assert "worker died (exit -9); restarting (1/2)" in events[0] and "up" in events[0]
    flag.touch()
    wait_for(lambda: not sup.check())
    codes = sup.stop()
    assert codes["trainer"] == 0 and codes["worker"] == -signal.SIGTERM
    assert "=== start" in (tmp_path / "logs" / "worker.log").read_text()
    assert sup.failed == []


def test_role_out_of_restarts_is_reported_failed(tmp_path: Path) -> None:
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=1, grace_s=5, on_event=events.append)
    sup.start([RoleSpec("bad", py("import sys; print('boom'); sys.exit(3)"), terminal=True)])
    wait_for(lambda: not sup.check())
    assert sup.failed == ["bad"] and sup.roles["bad"].exit_codes == [3, 3]
    assert "not restarted" in events[-1] and "boom" in events[-1]
    sup.stop()


def test_a_role_runs_at_its_niceness(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, max_restarts=0, grace_s=5)
    loop = "import time\nwhile True: time.sleep(0.1)"
    sup.start([RoleSpec("measured", py(loop), nice=7), RoleSpec("plain", py(loop))])
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        pids = {n: r.proc.pid for n, r in sup.roles.items() if r.proc is not None}
        assert os.getpriority(os.PRIO_PROCESS, pids["measured"]) == min(19, base + 7)
        assert os.getpriority(os.PRIO_PROCESS, pids["plain"]) == base
    finally:
        sup.stop()


def test_the_run_starts_its_evaluators_niced(tmp_path: Path) -> None:
    from astraflow.config import load_experiment
    from astraflow.run.launch import rl_roles

    root = Path(__file__).resolve().parents[2]
    cfg = load_experiment(root / "examples" / "solver_verifier.yaml")
    nice = {r.name: r.nice for r in rl_roles(cfg, tmp_path / "c.yaml", tmp_path)}
    assert nice["evaluator-solver"] == nice["evaluator-team"] == cfg.launch.eval_nice == 10
    assert {n for n, v in nice.items() if v} == {"evaluator-solver", "evaluator-verifier",
                                                  "evaluator-team"}


def test_a_full_disk_does_not_kill_the_supervisor(tmp_path: Path) -> None:
    """processes.json cannot be written (the run directory's disk is full: bench/chaos.py
    found `astraflow run` dying of ENOSPC here mid-restart, its roles left running with no
    one to stop them): the restart still happens, the failure is said once, and the file is
    written again once it can be."""
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=2, grace_s=5, on_event=events.append)
    sup.start([RoleSpec("worker", py("import time\nwhile True: time.sleep(0.1)"))])
    first = sup.roles["worker"].proc
    assert first is not None
    (tmp_path / ".processes.json.tmp").mkdir()  # every write of the file now fails (OSError)
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and sup.roles["worker"].restarts == 1)
    second = sup.roles["worker"].proc
    assert second is not None and second.pid != first.pid and second.poll() is None
    assert sum("processes.json not written" in e for e in events) == 1, events
    (tmp_path / ".processes.json.tmp").rmdir()
    os.kill(second.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and sup.roles["worker"].restarts == 2)
    import json

    assert json.loads((tmp_path / "processes.json").read_text())["worker"] == \
        sup.roles["worker"].proc.pid  # type: ignore[union-attr]
    sup.stop()


def test_a_log_the_disk_refuses_does_not_stop_a_restart(tmp_path: Path) -> None:
    """The role's log is on a full disk (/dev/full refuses every write with ENOSPC): the start
    banner is lost, the role is started again anyway (bench/chaos.py's disk_full fault found
    `astraflow run` dying of ENOSPC while it restarted a role)."""
    events: list[str] = []
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.log").symlink_to("/dev/full")
    sup = Supervisor(tmp_path, max_restarts=2, grace_s=5, on_event=events.append)
    sup.start([RoleSpec("worker", py("import time\nwhile True: time.sleep(0.1)"))])
    first = sup.roles["worker"].proc
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and sup.roles["worker"].restarts == 1)
    second = sup.roles["worker"].proc
    assert second is not None and second.pid != first.pid and second.poll() is None
    assert "worker died (exit -9); restarting (1/2)" in events[0], events
    sup.stop()


def test_a_start_that_raises_is_tried_again_as_a_restart(tmp_path: Path) -> None:
    """A restart whose start raises OSError (here: the program is gone) does not end the
    supervisor: it counts as a restart and is tried at the next check; out of restarts, the
    role has failed."""
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=3, grace_s=5, on_event=events.append)
    loop = py("import time\nwhile True: time.sleep(0.1)")
    sup.start([RoleSpec("worker", loop)])
    r = sup.roles["worker"]
    first = r.proc
    assert first is not None
    r.spec.argv = [str(tmp_path / "gone")]
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and r.restarts == 1)
    assert r.proc is first and r.unstarted
    assert any("worker could not be started" in e for e in events), events
    r.spec.argv = loop
    assert sup.check() is True and r.restarts == 2 and not r.unstarted
    assert r.proc is not first and r.proc is not None and r.proc.poll() is None
    assert r.exit_codes == [-signal.SIGKILL]  # the one exit, counted once
    r.spec.argv = [str(tmp_path / "gone")]
    os.kill(r.proc.pid, signal.SIGKILL)
    wait_for(lambda: (sup.check() or True) and sup.failed == ["worker"])
    assert r.restarts == 3 and "not restarted (3 restarts made)" in events[-1], events
    sup.stop()
