"""The scaler inside `astraflow run` (``scale.enabled``): the ``local`` actuator is the run's
supervisor, which starts and retires ``rollout-<n>`` roles; the scaler's processor is run
between the supervisor's ticks, so one loop drives both. The reporter is a role process of
its own (launch.rl_roles)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.config import ExperimentConfig
from astraflow.consumers.scaler.actuators import Actuation
from astraflow.core.launcher import cli
from astraflow.run.roles import ScalerRole
from astraflow.run.supervisor import RoleSpec, Supervisor

log = logging.getLogger("astraflow.run")
PREFIX = "rollout-"


@dataclass
class SupervisedPool:
    """The ``local`` actuator of `astraflow run`: rollout roles of the supervisor. Scale-up
    starts ``rollout-<n>`` with the next free n; scale-down retires the newest ones (SIGTERM:
    they drain; the supervisor reaps them)."""

    sup: Supervisor
    argv: list[str]
    env: dict[str, str]
    restart: bool = True

    def names(self) -> list[str]:
        """The pool's roles that run and are not being retired, oldest first."""
        rs = [(n, r) for n, r in self.sup.roles.items()
              if n.startswith(PREFIX) and r.retiring is None and r.state != "done"]
        return [n for n, _ in sorted(rs, key=lambda x: int(x[0][len(PREFIX):]))]

    def count(self) -> int | None:
        return len(self.names())

    def scale(self, target: int, current: int) -> Actuation:
        started = time.monotonic()
        names = self.names()
        if target > len(names):
            used = [int(n[len(PREFIX):]) for n in self.sup.roles if n.startswith(PREFIX)]
            nxt = max(used, default=-1) + 1
            for i in range(nxt, nxt + target - len(names)):
                self.sup.add(RoleSpec(f"{PREFIX}{i}", list(self.argv), restart=self.restart,
                                      env=dict(self.env)))
        else:
            for n in names[target:][::-1]:  # the newest first
                self.sup.retire(n)
        return Actuation(ok=True, target=target, previous=len(names), attempts=1, error="",
                         duration_s=time.monotonic() - started)

    def close(self) -> None:
        return None


def run_scaler(config: ExperimentConfig, bus: Any, sup: Supervisor, cfg_path: Path,
               out: Path, env: dict[str, str]) -> ScalerRole:
    """The scaler of a run on its bus: the local pool acts through ``sup``, the others through
    their configured actuators. The run's loop calls ``run(None, 0.05)`` between its ticks."""
    local = {name: SupervisedPool(sup, cli("rollout", str(cfg_path), "--out", str(out),
                                           *pool.actuator.rollout_args), env,
                                  config.launch.restart)
             for name, pool in config.scale.pools.items() if pool.actuator.type == "local"}
    return ScalerRole(config, bus, cfg_path, out, actuators=local, poll_timeout=0.05)


def initial_workers(config: ExperimentConfig) -> int:
    """How many rollout processes `astraflow run` starts: ``launch.rollout_workers``, within
    the first local pool's bounds when the scaler is on."""
    n = config.launch.rollout_workers
    if not config.scale.enabled:
        return n
    for pool in config.scale.pools.values():
        if pool.actuator.type == "local":
            return max(pool.min_workers, min(pool.max_workers, n))
    return n
