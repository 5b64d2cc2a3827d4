"""`astraflow run`'s scaler plumbing: the supervisor as the local actuator (real processes,
real signals), the roles a scaled run starts, the config checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.core.errors import ConfigError
from astraflow.run.launch import rl_roles
from astraflow.run.scaling import SupervisedPool, initial_workers
from astraflow.run.supervisor import RoleSpec, Supervisor

#: a rollout stand-in: up until SIGTERM, then "drains" (writes a marker) and exits 0
DRAINS = ("import os, signal, sys, time, pathlib\n"
          "def stop(*_):\n"
          "    pathlib.Path(sys.argv[1]).joinpath(f'drained-{os.getpid()}').touch()\n"
          "    sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, stop)\n"
          "print('up', flush=True)\n"
          "while True: time.sleep(0.05)\n")


def up(sup: Supervisor, name: str) -> bool:
    """Has role ``name`` printed ``up`` (its signal handler is set)? Its log starts with the
    command line, which holds the word too."""
    return "up" in sup.roles[name].tail().splitlines()[-1:]


def test_the_supervisor_scales_rollout_roles_up_and_retires_the_newest(tmp_path: Path) -> None:
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=3, grace_s=10, on_event=events.append)
    argv = [sys.executable, "-c", DRAINS, str(tmp_path)]
    sup.start([RoleSpec("rollout-0", argv)])
    pool = SupervisedPool(sup, argv, env={})
    assert pool.count() == 1

    grown = pool.scale(3, 1)
    assert grown.ok and grown.previous == 1 and pool.count() == 3
    assert sorted(sup.roles) == ["rollout-0", "rollout-1", "rollout-2"]
    wait_for(lambda: all(up(sup, n) for n in sup.roles))

    down = pool.scale(1, 3)
    assert down.ok and pool.count() == 1
    assert pool.names() == ["rollout-0"]  # the oldest stays
    wait_for(lambda: (sup.check() or True)
             and sum("(scale-down, exit" in e for e in events) == 2)
    assert not sup.retiring()
    # retired roles exit 0 after their drain, and are neither restarted nor failures
    assert sup.failed == []
    assert all(sup.roles[n].restarts == 0 for n in sup.roles)
    assert any("rollout-2 stopped (scale-down, exit 0)" in e for e in events)
    assert any("rollout-1 stopped (scale-down, exit 0)" in e for e in events)
    assert "(scaled down)" in sup.states()["rollout-2"]
    assert len(list(tmp_path.glob("drained-*"))) == 2  # each drained on its SIGTERM

    again = pool.scale(2, 1)  # a new name, not a retired one's
    assert again.ok and pool.names() == ["rollout-0", "rollout-3"]
    wait_for(lambda: up(sup, "rollout-3"))
    codes = sup.stop()
    assert codes["rollout-0"] == 0 and codes["rollout-3"] == 0


def test_a_retired_role_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    events: list[str] = []
    sup = Supervisor(tmp_path, max_restarts=3, grace_s=0.5, on_event=events.append)
    stubborn = [sys.executable, "-c", "import signal, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
                "while True: time.sleep(0.05)"]
    sup.start([RoleSpec("rollout-0", stubborn)])
    wait_for(lambda: up(sup, "rollout-0"))
    sup.retire("rollout-0")
    wait_for(lambda: (sup.check() or True) and any("(scale-down, exit" in e for e in events))
    assert any("did not stop in 0s; killing" in e for e in events)
    assert sup.roles["rollout-0"].exit_codes == [-9] and sup.failed == []


def config(**scale: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"launch": {"rollout_workers": 5},
                                            "scale": {"enabled": True, **scale}})


def test_a_scaled_run_starts_the_reporter_and_its_workers_within_the_bounds(
        tmp_path: Path) -> None:
    cfg = config(pools={"rollout": {"min_workers": 1, "max_workers": 3}})
    assert initial_workers(cfg) == 3
    names = [r.name for r in rl_roles(cfg, tmp_path / "c.yaml", tmp_path)]
    assert [n for n in names if n.startswith("rollout-")] == ["rollout-0", "rollout-1",
                                                              "rollout-2"]
    assert "reporter" in names
    off = ExperimentConfig.model_validate({"launch": {"rollout_workers": 5}})
    assert initial_workers(off) == 5
    assert "reporter" not in [r.name for r in rl_roles(off, tmp_path / "c.yaml", tmp_path)]


def test_pool_policies_must_be_policies() -> None:
    from astraflow.config import load_experiment

    with pytest.raises(ConfigError, match=r"scale.pools.rollout.policies.*unknown policy 'x'"):
        load_experiment(None, ["scale.pools.rollout.policies=[x]"])
