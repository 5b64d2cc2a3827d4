"""The rollout worker in-process on the embedded bus: tasks in, trajectory groups out, commits,
dead letters, failed episodes, metrics, a weight update mid-episode, draining."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rollout_helpers import make_task, produce, read_all
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.core.bus import Bus
from astraflow.core.records import ChatMessage, DeadLetter, Metric, Task, Trajectory
from astraflow.core.topics import group_name, topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker


def make_config(tmp_path: Path, model: Path, **rollout: Any) -> ExperimentConfig:
    base: dict[str, Any] = {"engine": {"model": str(model), "threads": 1, "max_new_tokens": 4},
                            "weights": {"enabled": False},
                            "drain_timeout": 60, "metrics_interval": 0.2,
                            "commit_interval": 0.05, "poll_timeout": 0.05}
    for k, v in rollout.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and k in base else v
    return ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{tmp_path}/bus.db",
                "partitions": {"tasks": 4, "trajectories": 4}},
        "rollout": base})


@pytest.fixture
def setup(tmp_path: Path, arith_dir: Path):  # noqa: ANN201
    buses: list[Bus] = []

    def make(**rollout: Any) -> tuple[ExperimentConfig, Bus]:
        cfg = make_config(tmp_path, arith_dir, **rollout)
        bus = open_bus(cfg, tmp_path)
        buses.append(bus)
        return cfg, bus

    yield make
    for b in buses:
        b.close()


def rollout_lag(bus: Bus, run: str) -> int:
    """Tasks of ``run`` its rollout group has not committed."""
    return sum(bus.lag(group_name(run, "rollout"), topic_name(run, "tasks")).values())


def by_group(trajs: list[Trajectory]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, set()).add(t.id)
    return groups


def test_tasks_become_trajectory_groups(setup, tmp_path: Path) -> None:
    cfg, bus = setup(workflow={"allow_task_paths": True})  # a task names a module path
    run = cfg.run
    good = [make_task(i, n=3) for i in range(10)]
    failing = make_task(50, n=2, workflow="rollout_helpers:failing_workflow")
    unknown = make_task(60, workflow="no_such_workflow")
    empty = Task(id="empty", dataset="t", prompt=[], n_samples=2)
    produce(bus, run, [*good[:5], failing, unknown, empty, *good[5:]])
    p = bus.producer()
    p.produce(topic_name(run, "tasks"), b"\x93not a task", key=b"garbage")
    p.flush()

    worker = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-1")
    stats = worker.run(max_tasks=14)

    trajs = read_all(bus, topic_name(run, "trajectories"))
    ok = [t for t in trajs if t.finish_reason != "error"]
    failed = [t for t in trajs if t.finish_reason == "error"]
    assert len(ok) == 30 and len(failed) == 2
    assert len({t.id for t in trajs}) == len(trajs)  # no duplicates without a crash
    groups = by_group(ok)
    for task in good:
        gid = task.resolved_group_id()
        assert groups[gid] == {f"{gid}/default/{i}" for i in range(3)}
    for t in ok:
        mask = np.frombuffer(t.loss_mask, "u1")
        versions = np.frombuffer(t.versions, "<i4")
        assert t.worker_id == "w-1" and t.policy == "default" and t.prompt_len > 0
        assert t.group_size == 3
        assert 1 <= mask.sum() <= 4 and (versions[mask == 1] == 0).all()
        assert (versions[mask == 0] == -1).all()
        assert set(t.timings) >= {"generate", "reward", "total"}
    assert all("boom in the workflow" in (t.error or "") for t in failed)

    dead = read_all(bus, topic_name(run, "dlq"), DeadLetter)
    assert sorted(d.key for d in dead) == [b"empty", b"garbage", b"task-60"]
    assert any("no_such_workflow" in d.error for d in dead)
    assert all(d.group == group_name(run, "rollout") for d in dead)

    assert rollout_lag(bus, run) == 0
    assert stats.tasks_done == 11 and stats.tasks_dead_lettered == 3
    assert stats.episodes == 32 and stats.episodes_failed == 2

    metrics = [m for m in read_all(bus, topic_name(run, "metrics"), Metric)
               if m.component == "w-1"]
    assert metrics[0].status == "starting" and metrics[-1].status == "stopped"
    last = metrics[-1]
    assert last.counters["episodes"] == 32 and last.counters["failures"] == 2
    assert last.counters["dead_lettered"] == 3
    assert last.counters["tokens"] == sum(
        int(np.frombuffer(t.loss_mask, "u1").sum()) for t in ok)
    assert {"inflight", "weight_version", "episodes_per_s",
            "gen_tokens_per_s"} <= set().union(*(m.gauges for m in metrics))


def test_weight_update_mid_episode_changes_later_versions(setup, tmp_path: Path,
                                                         arith_dir: Path) -> None:
    """Turn 1 is generated at version 0; the trainer publishes version 1; the worker's follower
    applies it; turn 2 of the same episode is generated at version 1."""
    from astraflow.models.tiny import load
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore

    cfg, bus = setup(weights={"enabled": True, "poll_interval": 0.05})
    trainer, _ = load(arith_dir)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    pub = Publisher(bus, run=cfg.run, policy="default", store=FileStore(tmp_path / "weights"))
    published = threading.Event()

    async def two_turns(ctx: Any, task: Task) -> Any:
        gen = await ctx.generate(messages=task.prompt)
        if not published.is_set():
            published.set()
            await asyncio.to_thread(lambda: (pub.publish(trainer.state_dict(), 1), pub.flush()))
        engine = ctx.runtime.engines["default"]
        for _ in range(2000):  # poll with a deadline (20 s)
            if engine.version == 1:
                break
            await asyncio.sleep(0.01)
        gen.conversation.add(ChatMessage(role="user", content="1+1="))
        await gen.conversation.generate()
        return gen.conversation.finish(1.0)

    WORKFLOWS.add("test_two_turns", two_turns)
    produce(bus, cfg.run, [make_task(0, n=1, workflow="test_two_turns")])
    worker = configured_worker(cfg, tmp_path, bus=bus)
    worker.run(max_tasks=1)
    pub.close()
    (t,) = read_all(bus, topic_name(cfg.run, "trajectories"))
    versions = np.frombuffer(t.versions, "<i4")
    spans = [s for s in t.spans if s.role == "assistant"]
    assert len(spans) == 2
    assert set(versions[spans[0].start:spans[0].end]) == {0}
    assert set(versions[spans[1].start:spans[1].end]) == {1}
    # the heartbeat says where the weight sync's time went and how far behind the worker is
    last = [m for m in read_all(bus, topic_name(cfg.run, "metrics"), Metric)
            if m.role == "rollout"][-1]
    assert last.gauges["weights.lag.default"] == 0
    assert last.counters["weights.apply_s.default"] > 0
    assert last.counters["weights.fetched_bytes.default"] == 0  # a local store: read in place


def _run_in_thread(worker: Any, **kw: Any) -> threading.Thread:
    t = threading.Thread(target=worker.run, kwargs=kw, daemon=True)
    t.start()
    return t


def test_drain_finishes_in_flight_episodes(setup, tmp_path: Path) -> None:
    cfg, bus = setup(max_concurrent_episodes=4,
                     workflow={"kwargs": {"rollout_helpers:slow_single_turn": {"delay": 0.5}}})
    tasks = [make_task(i, n=2, workflow="rollout_helpers:slow_single_turn") for i in range(12)]
    produce(bus, cfg.run, tasks)
    worker = configured_worker(cfg, tmp_path, bus=bus)
    thread = _run_in_thread(worker)
    wait_for(lambda: worker.stats.tasks_taken >= 2, 60, "the worker to take tasks")
    worker.request_stop()
    thread.join(90)
    assert not thread.is_alive()
    taken = worker.stats.tasks_taken
    assert 2 <= taken < 12 and worker.stats.tasks_done == taken
    assert worker.stats.tasks_released == 0
    trajs = read_all(bus, topic_name(cfg.run, "trajectories"))
    assert len(trajs) == 2 * taken
    assert rollout_lag(bus, cfg.run) == 12 - taken


def test_drain_timeout_releases_unfinished_tasks_to_the_next_worker(setup,
                                                                    tmp_path: Path) -> None:
    cfg, bus = setup(max_concurrent_episodes=4, drain_timeout=0,
                     workflow={"kwargs": {"rollout_helpers:slow_single_turn": {"delay": 2.0}}})
    tasks = [make_task(i, n=2, workflow="rollout_helpers:slow_single_turn") for i in range(4)]
    produce(bus, cfg.run, tasks)
    first = configured_worker(cfg, tmp_path, bus=bus)
    thread = _run_in_thread(first)
    wait_for(lambda: first.stats.tasks_taken >= 1, 60, "the first worker to take a task")
    first.request_stop()
    thread.join(60)
    assert first.stats.tasks_released >= 1 and first.stats.tasks_done == 0
    assert rollout_lag(bus, cfg.run) == 4  # none committed

    second = configured_worker(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"drain_timeout": 60.0})}), tmp_path, bus=bus)
    second.run(max_tasks=4)
    groups = by_group(read_all(bus, topic_name(cfg.run, "trajectories")))
    assert Counter(len(ids) for ids in groups.values()) == {2: 4}
    assert rollout_lag(bus, cfg.run) == 0


def test_a_busy_worker_hands_partitions_to_a_new_one(setup, tmp_path: Path) -> None:
    """Worker A is full (its episodes wait on a gate) when B joins: A still polls now and then,
    gives B its share of the partitions (releasing the in-flight tasks of those), and once the
    gate opens they finish every task between them."""
    gate = threading.Event()

    async def gated(ctx: Any, task: Task) -> Any:
        while not gate.is_set():
            await asyncio.sleep(0.01)
        gen = await ctx.generate(messages=task.prompt)
        return gen.conversation.finish(await ctx.reward(gen.text))

    WORKFLOWS.add("test_gated", gated)
    cfg, bus = setup(max_concurrent_episodes=2, session_timeout=3.0)
    n_tasks = 16
    produce(bus, cfg.run, [make_task(i, n=1, workflow="test_gated") for i in range(n_tasks)])
    a = configured_worker(cfg, tmp_path, bus=bus, worker_id="a")
    ta = _run_in_thread(a)
    wait_for(lambda: a.stats.tasks_taken >= 2, 60, "worker a to fill its slots")
    b = configured_worker(cfg, tmp_path, bus=bus, worker_id="b")
    tb = _run_in_thread(b)
    try:
        wait_for(lambda: b.stats.tasks_taken >= 1, 60, "worker b to get tasks while a is full")
    finally:
        gate.set()
    trajectories = topic_name(cfg.run, "trajectories")

    def done() -> bool:
        return len({t.group_id for t in read_all(bus, trajectories)}) == n_tasks

    wait_for(done, 120, "every task's trajectory", every=0.2)
    a.request_stop()
    b.request_stop()
    ta.join(60)
    tb.join(60)
    assert not ta.is_alive() and not tb.is_alive()
    trajs = read_all(bus, trajectories)
    assert {t.id for t in trajs} == {f"task-{i}#0/default/0" for i in range(n_tasks)}
    assert {t.worker_id for t in trajs} == {"a", "b"}
    assert rollout_lag(bus, cfg.run) == 0


def test_a_worker_starting_after_a_publish_generates_at_that_version(
        setup, tmp_path: Path, arith_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A (re)started worker catches up with weights.<policy> before its first task: its engine
    starts from the model directory (version 0), and a task taken before the follower thread's
    first look would be generated at version 0 with version 3 already published."""
    import time

    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.models.tiny import load
    from astraflow.run.roles import configured_publisher

    loop = WeightFollower._loop

    def late_loop(self: WeightFollower) -> None:  # the thread looks late (a slow first fetch)
        time.sleep(3.0)
        loop(self)

    monkeypatch.setattr(WeightFollower, "_loop", late_loop)

    cfg, bus = setup(weights={"enabled": True, "poll_interval": 5.0},
                     max_concurrent_episodes=64)
    model, _ = load(arith_dir)
    pub = configured_publisher(cfg, "default", tmp_path, bus)
    pub.publish(model.state_dict(), 3)
    pub.flush()
    produce(bus, cfg.run, [make_task(i, n=4) for i in range(16)])
    worker = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-late")
    worker.run(max_tasks=16)
    trajs = read_all(bus, topic_name(cfg.run, "trajectories"))
    assert len(trajs) == 64
    for t in trajs:
        mask = np.frombuffer(t.loss_mask, "u1")
        assert set(np.frombuffer(t.versions, "<i4")[mask == 1].tolist()) == {3}, t.id
        assert t.version_vector == {"default": 3}
