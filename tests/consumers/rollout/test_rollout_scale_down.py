"""Graceful scale-down (docs/elastic.md#scaling-down-without-losing-work): a worker asked to
stop mid-episode finishes what will still be fresh, releases the rest uncommitted, commits and leaves; another worker of the group
redoes what was released. Every task yields exactly one trajectory group: none lost, none
twice; on both bus backends, in-process and as a process stopped by a real SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rollout_helpers import Follow, make_task, produce, read_all
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.drain import InFlight, oldest_versions, stale_by, to_release
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.core.bus import Bus
from astraflow.core.records import Metric, Task, Trajectory
from astraflow.core.topics import group_name, topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_publisher, configured_worker

HERE = Path(__file__).parent
HELD = "rollout_helpers:held_single_turn"
N_TASKS, N_SAMPLES = 12, 2


def config(bus_url: str, model: Path, run: str, *, data: dict[str, Any] | None = None,
           partitions: int = 4, **rollout: Any) -> dict[str, Any]:
    kafka = bus_url.startswith("kafka")
    base: dict[str, Any] = {
        "engine": {"model": str(model), "threads": 1, "max_new_tokens": 4},
        "weights": {"enabled": False}, "drain_timeout": 60,
        "session_timeout": 6.0 if kafka else 3.0, "metrics_interval": 0.2,
        "commit_interval": 0.05, "poll_timeout": 0.05}
    return {"run": run, "bus": {"url": bus_url, "partitions": {
                "tasks": partitions, "trajectories": 4, "metrics": 1}},
            "data": data or {}, "rollout": {**base, **rollout}}


def held(hold: float) -> dict[str, Any]:
    return {"kwargs": {HELD: {"hold": hold}}}


def lag(bus: Bus, run: str) -> int:
    """Tasks of ``run`` its rollout group has not committed."""
    return sum(bus.lag(group_name(run, "rollout"), topic_name(run, "tasks")).values())


def assert_exactly_once(trajs: list[Trajectory], n_tasks: int, n_samples: int) -> None:
    """Every task produced one group of ``n_samples`` trajectories, none twice."""
    ids = Counter(t.id for t in trajs)
    assert ids == Counter({f"task-{i}#0/default/{s}": 1 for i in range(n_tasks)
                           for s in range(n_samples)}), ids
    assert all(t.finish_reason != "error" for t in trajs)


def in_flight(stats: Any) -> int:
    return (stats.tasks_taken - stats.tasks_done - stats.tasks_dead_lettered
            - stats.tasks_released)


def start(worker: Any) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


# -- the pure part: which tasks a drain releases -----------------------------------------------

def test_a_drain_releases_a_suffix_from_the_oldest_releasable_stale_task() -> None:
    def f(offset: int, stale: bool = False, producing: bool = False) -> InFlight:
        return InFlight(offset, offset, stale, producing)

    assert to_release([f(3), f(4), f(5)], -1) == []
    # 4 is stale: it and 5 behind it go (5 finishing would only be produced twice)
    assert [t.offset for t in to_release([f(3), f(4, True), f(5)], -1)] == [4, 5]
    # 5 already produced: releasing 4 would have 5 produced again; 4 is finished instead
    assert to_release([f(3), f(4, True), f(5, producing=True)], -1) == []
    assert to_release([f(3), f(4, True)], 6) == []
    # a stale task after the produced ones is still released
    assert [t.offset for t in to_release([f(4, True), f(6), f(7, True), f(8)], 5)] == [7, 8]


def test_staleness_is_judged_per_policy_on_the_oldest_generated_token(
        rule_engine: Any, ascii_tokenizer: Any) -> None:
    from astraflow.consumers.rollout.context import EpisodeContext
    from astraflow.consumers.rollout.runtime import Runtime

    engines = {p: rule_engine(ascii_tokenizer, lambda _: "ok") for p in ("solver", "judge")}
    rt = Runtime.create(engines)
    ctx = EpisodeContext(rt, make_task(0), 0)
    assert oldest_versions([ctx]) == {}  # nothing generated: fresh whatever the newest is
    c = ctx.conversation(policy="solver")
    c.versions += [2, 1, 3]  # after the prompt's -1s
    ctx.conversation(policy="judge").versions += [5]
    oldest = oldest_versions([ctx])
    assert oldest == {"solver": 1, "judge": 5}
    assert stale_by(oldest, {"solver": 3, "judge": 9}, {"solver": 2, "judge": 4}) is None
    assert stale_by(oldest, {"solver": 4, "judge": 9}, {"solver": 2, "judge": 4}) == "solver"
    assert stale_by(oldest, {"solver": 3, "judge": 10}, {"solver": 2, "judge": 4}) == "judge"
    assert stale_by(oldest, {"solver": 9, "judge": 10}, {"judge": 9}) is None  # no bound


# -- scale-down mid-episode, two workers on one group, both backends --------------------------

@pytest.fixture
def buses() -> Iterator[list[Bus]]:
    opened: list[Bus] = []
    yield opened
    for b in opened:
        b.close()


def test_scale_down_mid_episode_loses_nothing(bus_url: str, tmp_path: Path, arith_dir: Path,
                                              buses: list[Bus]) -> None:
    """A holds its episodes mid-flight (one task at a time, so it finishes in offset order);
    B joins the group (A hands it a share of the partitions); A, stopped, waits drain_timeout,
    releases its held task, commits and leaves; B redoes the released task and takes A's
    partitions."""
    run = f"s{uuid.uuid4().hex[:8]}"
    cfg_a = ExperimentConfig.model_validate(config(
        bus_url, arith_dir, run, workflow=held(3600), max_concurrent_episodes=N_SAMPLES,
        drain_timeout=0.5))
    cfg_b = ExperimentConfig.model_validate(config(
        bus_url, arith_dir, run, workflow=held(0.05), max_concurrent_episodes=4))
    bus = open_bus(cfg_b, tmp_path)
    buses.append(bus)
    produce(bus, run, [make_task(i, n=N_SAMPLES, workflow=HELD) for i in range(N_TASKS)])
    a = configured_worker(cfg_a, tmp_path, bus=bus, worker_id="a")
    b = configured_worker(cfg_b, tmp_path, bus=bus, worker_id="b")
    ta = start(a)
    tb: threading.Thread | None = None
    try:
        wait_for(lambda: in_flight(a.stats) >= 1, 120, "a to hold a task")
        tb = start(b)  # (a releases its held task if its partition moves to b, takes another)
        wait_for(lambda: b.stats.tasks_done >= 1 and in_flight(a.stats) >= 1, 120,
                 "a mid-episode while b works")
        a.request_stop()
        ta.join(60)
        assert not ta.is_alive()
        # it had taken one task more than it could start (the first batch it read): both
        # were released, neither finished
        assert a.stats.tasks_done == 0 and a.stats.drained_finished == 0
        assert a.stats.drained_released_timeout >= 1
        assert a.stats.tasks_released == a.stats.tasks_taken
        assert a.stats.drained_released_stale == a.stats.drained_released_behind == 0
        trajectories = topic_name(run, "trajectories")
        wait_for(lambda: len({t.group_id for t in read_all(bus, trajectories)}) == N_TASKS,
                 180, "every task's trajectories", every=0.2)
    finally:
        a.request_stop()
        b.request_stop()
        ta.join(60)
        if tb is not None:
            tb.join(60)
    assert tb is not None and not tb.is_alive()
    trajs = read_all(bus, trajectories)
    assert_exactly_once(trajs, N_TASKS, N_SAMPLES)
    assert {t.worker_id for t in trajs} == {"b"}
    assert lag(bus, run) == 0


@pytest.mark.slow
def test_sigterm_scale_down_of_a_worker_process_loses_nothing(
        bus_url: str, tmp_path: Path, arith_dir: Path, buses: list[Bus]) -> None:
    """The same with worker processes (`run_configured_worker`, as `astraflow rollout` runs it)
    and a real SIGTERM: A exits 0 having released its held task; B finishes every task."""
    run = f"s{uuid.uuid4().hex[:8]}"
    cfgs = {"a": config(bus_url, arith_dir, run, workflow=held(3600),
                        max_concurrent_episodes=N_SAMPLES, drain_timeout=0.5),
            "b": config(bus_url, arith_dir, run, workflow=held(0.05),
                        max_concurrent_episodes=4)}
    bus = open_bus(ExperimentConfig.model_validate(cfgs["b"]), tmp_path)
    buses.append(bus)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}

    def spawn(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(HERE / "_rollout_worker.py"), json.dumps(cfgs[name]),
             str(tmp_path), name], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

    produce(bus, run, [make_task(i, n=N_SAMPLES, workflow=HELD) for i in range(N_TASKS)])
    procs = {"a": spawn("a")}
    try:
        metrics = Follow(bus, topic_name(run, "metrics"), Metric)
        trajs = Follow(bus, topic_name(run, "trajectories"), Trajectory)

        def a_holds_a_task() -> bool:  # by its newest heartbeat
            a = [m for m in metrics.poll() if m.component == "a"]
            return bool(a) and a[-1].gauges.get("inflight_tasks", 0) >= 1

        wait_for(a_holds_a_task, 120, "a to hold a task")
        procs["b"] = spawn("b")
        wait_for(lambda: trajs.poll() and a_holds_a_task(), 120, "a mid-episode while b works")
        procs["a"].send_signal(signal.SIGTERM)
        out, _ = procs["a"].communicate(timeout=120)
        assert procs["a"].returncode == 0, out
        stats = json.loads(out.split("stats ", 1)[1].splitlines()[0])
        assert stats["tasks_done"] == 0 and stats["drained_released_timeout"] >= 1, stats
        assert stats["tasks_released"] == stats["tasks_taken"], stats

        def complete() -> bool:
            return len({t.group_id for t in trajs.poll()}) == N_TASKS

        wait_for(complete, 180, "every task's trajectories")
        procs["b"].send_signal(signal.SIGTERM)
        out, _ = procs["b"].communicate(timeout=120)
        assert procs["b"].returncode == 0, out
        assert_exactly_once(read_all(bus, topic_name(run, "trajectories")), N_TASKS, N_SAMPLES)
        assert lag(bus, run) == 0
        stopped = {m.component for m in metrics.poll() if m.status == "stopped"}
        assert stopped == {"a", "b"}
        drained = [m for m in metrics.records if m.component == "a" and m.status == "stopped"]
        assert drained[-1].counters["drained_released_timeout"] == stats[
            "drained_released_timeout"]
    finally:
        for name, p in procs.items():
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    print(name, p.communicate(timeout=30)[0])  # shown when the test failed


# -- a staleness bound: the stale tasks are released, the fresh ones finished ------------------

@pytest.fixture
def aging() -> Iterator[tuple[threading.Event, threading.Event]]:
    """A workflow ``test_aging``: an ``old`` task generates (at the version then held) and
    then waits for the gate; a fresh one waits for the gate, then generates."""
    gate, old_generated = threading.Event(), threading.Event()

    async def until_open() -> None:
        while not gate.is_set():
            await asyncio.sleep(0.01)

    async def aging(ctx: Any, task: Task) -> Any:
        if task.dataset == "old":
            gen = await ctx.generate(messages=task.prompt)
            old_generated.set()
            await until_open()
        else:
            await until_open()
            gen = await ctx.generate(messages=task.prompt)
        return gen.conversation.finish(await ctx.reward(gen.text))

    WORKFLOWS.add("test_aging", aging)
    yield gate, old_generated
    gate.set()


def versions_of(t: Trajectory) -> set[int]:
    mask = np.frombuffer(t.loss_mask, "u1")
    return set(np.frombuffer(t.versions, "<i4")[mask == 1].tolist())


@pytest.mark.parametrize("when", ["before_the_stop", "while_draining", "no_staleness_filter"])
def test_a_drain_releases_what_is_too_stale_and_finishes_the_rest(
        when: str, tmp_path: Path, arith_dir: Path, buses: list[Bus],
        aging: tuple[threading.Event, threading.Event]) -> None:
    """One partition holds [fresh-0, old-1, fresh-2]. old-1 generated at version 0; the trainer
    publishes version 3 (bound 1). Draining, the worker releases old-1 at once, before its
    episode could end (before the stop, or when version 3 appears while it drains), and
    fresh-2 behind it on the partition (finishing it would only produce it twice); it finishes
    fresh-0 and commits it. A second worker redoes old-1 and fresh-2 at version 3. Without a
    staleness filter (no bound) the drain finishes all three, as before."""
    from astraflow.models.tiny import load

    gate, old_generated = aging
    filtered = when != "no_staleness_filter"
    run = f"s{uuid.uuid4().hex[:8]}"
    data = {"max_staleness": 1, "post_rollout": ["assembler", "staleness"] if filtered
            else ["assembler"]}
    cfg = ExperimentConfig.model_validate(config(
        f"embedded://{tmp_path}/bus.db", arith_dir, run, data=data, partitions=1,
        weights={"enabled": True, "poll_interval": 0.05}, max_concurrent_episodes=8))
    bus = open_bus(cfg, tmp_path)
    buses.append(bus)
    pub = configured_publisher(cfg, "default", tmp_path, bus)
    model, _ = load(arith_dir)
    tasks = [make_task(0, n=1, workflow="test_aging", dataset="fresh"),
             make_task(1, n=1, workflow="test_aging", dataset="old"),
             make_task(2, n=1, workflow="test_aging", dataset="fresh")]
    produce(bus, run, tasks)
    w = configured_worker(cfg, tmp_path, bus=bus, worker_id="w")
    assert w.drain_max_staleness == ({"default": 1} if filtered else None)
    engine = w.runtime.engines["default"]
    thread = start(w)
    metrics = Follow(bus, topic_name(run, "metrics"), Metric)

    def publish_v3() -> None:
        pub.publish(model.state_dict(), 3)
        pub.flush()
        wait_for(lambda: engine.version == 3 and w.followers[0].newest == 3, 60,
                 "the worker to follow version 3")

    try:
        wait_for(lambda: w.stats.tasks_taken == 3 and old_generated.is_set(), 60,
                 "old-1 to generate at version 0")
        if when != "while_draining":
            publish_v3()
        w.request_stop()
        wait_for(lambda: any(m.component == "w" and m.status == "draining"
                             for m in metrics.poll()), 60, "the worker to drain")
        if when == "while_draining":
            assert w.stats.drained_released_stale == 0
            publish_v3()
        if filtered:  # released while the gate is shut: not finished, released at once
            wait_for(lambda: w.stats.drained_released_stale == 1, 60, "old-1's release")
        gate.set()
        thread.join(60)
        assert not thread.is_alive()
    finally:
        gate.set()
        w.request_stop()
        thread.join(60)
        metrics.close()
    s = w.stats
    trajectories = topic_name(run, "trajectories")
    if not filtered:  # today's behaviour: finish everything in flight
        assert (s.drained_finished, s.tasks_released, s.drained_released_timeout) == (3, 0, 0)
        assert_exactly_once(read_all(bus, trajectories), 3, 1)
        assert lag(bus, run) == 0
        pub.close()
        return
    assert (s.drained_finished, s.drained_released_stale, s.drained_released_behind,
            s.drained_released_timeout, s.tasks_done, s.tasks_released) == (1, 1, 1, 0, 1, 2)
    (first,) = read_all(bus, trajectories)
    assert first.task_id == "task-0" and versions_of(first) == {3}
    assert lag(bus, run) == 2  # old-1 and fresh-2: released, not committed
    last = [m for m in read_all(bus, topic_name(run, "metrics"), Metric)
            if m.component == "w"][-1]
    assert last.status == "stopped"
    assert {k: last.counters[k] for k in ("drained_finished", "drained_released_stale",
                                          "drained_released_behind")} == dict.fromkeys(
        ("drained_finished", "drained_released_stale", "drained_released_behind"), 1)

    second = configured_worker(cfg, tmp_path, bus=bus, worker_id="w2")
    second.run(max_tasks=2)
    pub.close()
    trajs = read_all(bus, trajectories)
    assert_exactly_once(trajs, 3, 1)
    assert {t.task_id: t.worker_id for t in trajs} == {"task-0": "w", "task-1": "w2",
                                                      "task-2": "w2"}
    assert all(versions_of(t) == {3} for t in trajs)
    assert lag(bus, run) == 0


# -- a worker added by hand while a run goes on -------------------------------------------------

@pytest.mark.slow
def test_a_worker_added_by_hand_joins_and_shows_in_top(tmp_path: Path, arith_dir: Path,
                                                       buses: list[Bus]) -> None:
    """`astraflow rollout CONFIG --out RUN_DIR` from another terminal joins the run's group
    (it takes tasks), reports to its metrics topic (`astraflow top` lists it), and on SIGTERM
    drains, says so in its stats line and in top, and exits 0."""
    run = f"h{uuid.uuid4().hex[:8]}"
    cfg = config("embedded://{out}/bus.db", arith_dir, run)
    path = tmp_path / "config-rl.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    bus = open_bus(ExperimentConfig.model_validate(cfg), tmp_path)
    buses.append(bus)
    produce(bus, run, [make_task(i, n=N_SAMPLES) for i in range(4)])

    def astraflow(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "astraflow.cli.app", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def top() -> str:
        p = astraflow("top", str(path), "--out", str(tmp_path), "--once")
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        return out

    worker = astraflow("rollout", str(path), "--out", str(tmp_path), "--worker-id", "by-hand")
    try:
        metrics = Follow(bus, topic_name(run, "metrics"), Metric)
        wait_for(lambda: any(m.component == "by-hand" and m.counters.get("tasks_done") == 4
                             for m in metrics.poll()), 120, "the hand-added worker's tasks")
        line = next(ln for ln in top().splitlines() if "by-hand" in ln)
        assert "rollout" in line and "running" in line, line
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, out
        assert "drained_finished=0" in out and "drained_released_timeout=0" in out, out
        line = next(ln for ln in top().splitlines() if "by-hand" in ln)
        assert "stopped" in line, line
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert lag(bus, run) == 0
    assert len(read_all(bus, topic_name(run, "trajectories"))) == 4 * N_SAMPLES
