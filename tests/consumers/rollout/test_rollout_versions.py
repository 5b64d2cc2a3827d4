"""The version vector: every trajectory a worker writes records the version of every policy the
worker hosts, as its engines stood when the episode's records were written."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rollout_helpers import ScriptedEngine, make_task, produce, read_all

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.core.bus import Bus
from astraflow.core.records import Task, Trajectory
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker


async def solver_then_verifier(ctx: Any, task: Task) -> Any:
    """The solver answers at its version; its trainer then publishes (the worker's solver
    engine moves on) before the verifier judges: the episode ends under the newer solver."""
    answer = await ctx.generate(policy="solver", messages=task.prompt)
    solver = ctx.runtime.engines["solver"]
    solver._version += 1  # stands in for the weights follower applying the next version
    verdict = await ctx.generate(policy="verifier", messages=f"{answer.text} ok?")
    return [answer.conversation.finish(1.0), verdict.conversation.finish(0.0)]


WORKFLOWS.add("test_solver_then_verifier", solver_then_verifier)


@pytest.fixture
def bus_and_config(tmp_path: Path) -> Any:
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}", "policies": ["solver", "verifier"],
        "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "rollout": {"weights": {"enabled": False}, "drain_timeout": 60,
                    "max_concurrent_episodes": 1,  # episodes one after the other
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus = open_bus(cfg, tmp_path)
    yield cfg, bus
    bus.close()


def run_tasks(cfg: ExperimentConfig, bus: Bus, tmp_path: Path, engines: dict[str, Any],
              tasks: list[Task]) -> list[Trajectory]:
    produce(bus, cfg.run, tasks)
    worker = configured_worker(cfg, tmp_path, bus=bus, engines=engines, worker_id="w-v")
    worker.run(max_tasks=len(tasks))
    return read_all(bus, topic_name(cfg.run, "trajectories"))


def test_every_trajectory_records_the_versions_of_every_hosted_policy(
        bus_and_config: Any, tmp_path: Path, ascii_tokenizer: Any) -> None:
    cfg, bus = bus_and_config
    engines = {"solver": ScriptedEngine(ascii_tokenizer, ["5", "7"], version=3),
               "verifier": ScriptedEngine(ascii_tokenizer, ["yes", "no"], version=7)}
    trajs = run_tasks(cfg, bus, tmp_path, engines,
                      [make_task(0, n=1, workflow="test_solver_then_verifier"),
                       make_task(1, n=1, workflow="test_solver_then_verifier")])
    by_task: dict[str, dict[str, Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, {})[t.policy] = t
    assert sorted(by_task) == ["task-0", "task-1"]
    vectors = []
    for _, pair in sorted(by_task.items()):
        solver, verifier = pair["solver"], pair["verifier"]
        # one snapshot per episode: both policies' trajectories carry the same vector
        assert solver.version_vector == verifier.version_vector
        vectors.append(solver.version_vector)
        # the per-token versions stay the exact record of the trajectory's own tokens: the
        # solver generated before its engine moved on, so one behind its vector entry
        own = np.frombuffer(solver.versions, "<i4")[np.frombuffer(solver.loss_mask, "u1") == 1]
        assert own.size and set(own.tolist()) == {solver.version_vector["solver"] - 1}
        v_own = np.frombuffer(verifier.versions, "<i4")[
            np.frombuffer(verifier.loss_mask, "u1") == 1]
        assert set(v_own.tolist()) == {verifier.version_vector["verifier"]} == {7}
    # the two episodes ran one after the other, each moving the solver on by one:
    # the vectors are the engines' versions at each episode's end, every policy present
    assert sorted(v["solver"] for v in vectors) == [4, 5]
    assert all(set(v) == {"solver", "verifier"} and v["verifier"] == 7 for v in vectors)


def test_one_policy_records_a_vector_of_one(tmp_path: Path, ascii_tokenizer: Any) -> None:
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}", "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "rollout": {"weights": {"enabled": False}, "commit_interval": 0.05,
                    "poll_timeout": 0.05}})
    bus = open_bus(cfg, tmp_path)
    try:
        engines = {"default": ScriptedEngine(ascii_tokenizer, ["1", "2"], version=2)}
        trajs = run_tasks(cfg, bus, tmp_path, engines, [make_task(0, n=2)])
    finally:
        bus.close()
    assert len(trajs) == 2
    assert all(t.version_vector == {"default": 2} for t in trajs)
