"""Three worker processes share the tasks on each bus backend; one is SIGKILLed mid-episode and
every task still yields its trajectories; SIGTERM drains the others cleanly (exit 0, all
committed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rollout_helpers import Follow, make_task, produce
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.core.records import Metric, Trajectory
from astraflow.core.topics import group_name, topic_name
from astraflow.run.resources import open_bus

HERE = Path(__file__).parent
N_TASKS, N_SAMPLES = 36, 2
WORKFLOW = "rollout_helpers:slow_single_turn"


@pytest.mark.slow
def test_three_workers_share_tasks_and_survive_a_sigkill(bus_url: str, tmp_path: Path,
                                                         arith_dir: Path) -> None:
    kafka = bus_url.startswith("kafka")
    cfg = {
        "run": f"p{uuid.uuid4().hex[:8]}",
        "bus": {"url": bus_url, "partitions": {"tasks": 6, "trajectories": 6, "metrics": 1}},
        "rollout": {
            "engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 4},
            "weights": {"enabled": False},
            "max_concurrent_episodes": 4, "session_timeout": 6.0 if kafka else 3.0,
            "drain_timeout": 60, "metrics_interval": 0.5, "poll_timeout": 0.05,
            "workflow": {"kwargs": {WORKFLOW: {"delay": 0.3}}}}}
    config = ExperimentConfig.model_validate(cfg)
    run = config.run
    bus = open_bus(config, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    procs = {f"w{i}": subprocess.Popen(
        [sys.executable, str(HERE / "_rollout_worker.py"), json.dumps(cfg), str(tmp_path),
         f"w{i}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(3)}
    try:
        metrics = Follow(bus, topic_name(run, "metrics"), Metric)
        wait_for(lambda: {m.component for m in metrics.poll()} >= set(procs), 120,
                 "three workers to join")
        produce(bus, run, [make_task(i, n=N_SAMPLES, workflow=WORKFLOW)
                           for i in range(N_TASKS)])

        trajs = Follow(bus, topic_name(run, "trajectories"), Trajectory)
        wait_for(lambda: {t.worker_id for t in trajs.poll()} >= set(procs), 120,
                 "every worker to produce")
        victim = "w0"
        procs[victim].send_signal(signal.SIGKILL)  # mid-episode: it runs 4 at a time
        procs[victim].wait(30)
        before_kill = {t.id for t in trajs.records}

        def complete() -> bool:
            groups: dict[str, set[str]] = {}
            for t in trajs.poll():
                groups.setdefault(t.group_id, set()).add(t.id)
            return len(groups) == N_TASKS and all(len(v) == N_SAMPLES for v in groups.values())

        wait_for(complete, 180, "every task's trajectories")
        assert len({t.id for t in trajs.records}) > len(before_kill)
        for name in ("w1", "w2"):
            procs[name].send_signal(signal.SIGTERM)
        for name in ("w1", "w2"):
            out, _ = procs[name].communicate(timeout=120)
            assert procs[name].returncode == 0, out
            assert "stats" in out
        assert all(t.finish_reason != "error" for t in trajs.records)
        ids = {t.id for t in trajs.records}
        assert ids == {f"task-{i}#0/default/{s}" for i in range(N_TASKS)
                       for s in range(N_SAMPLES)}
        assert sum(bus.lag(group_name(run, "rollout"), topic_name(run, "tasks")).values()) == 0
        stopped = {m.component for m in metrics.poll() if m.status == "stopped"}
        assert stopped == {"w1", "w2"}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        bus.close()
