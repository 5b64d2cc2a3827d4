"""Backlog routing of released tasks: the router alone, and the pre-rollout stage on both
backends sending tasks away from partitions whose rollout consumer has fallen behind."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from policy_helpers import produce, read_all, task

from astraflow.config import ExperimentConfig
from astraflow.core.errors import BusError
from astraflow.core.records import Task, encode, schema_header
from astraflow.core.topics import topic_name
from astraflow.policies.routing import BacklogRouter
from astraflow.run.resources import open_bus
from astraflow.run.roles import run_configured_stage


def test_the_router_fills_the_shortest_queue_and_breaks_ties_in_turn() -> None:
    lag = {0: 5, 1: 0, 2: 2, 3: 0}
    r = BacklogRouter(lambda: lag, 4)
    r.refresh()
    picks = [r.pick() for _ in range(7)]
    # 1 and 3 are empty: taken in turn until they reach 2's backlog, then 1, 2, 3 in turn
    assert picks == [1, 3, 1, 3, 1, 2, 3]
    assert r.backlog() == [5, 3, 3, 3]


def test_an_idle_topic_is_filled_evenly_and_a_read_replaces_the_estimate() -> None:
    lag: dict[int, int] = {}
    r = BacklogRouter(lambda: lag, 3)
    assert [r.pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    lag.update({0: 0, 1: 4, 2: 1})  # partition 0's consumer finished its two, 1's is slow
    r.refresh()
    assert r.backlog() == [0, 4, 1]
    assert [r.pick() for _ in range(3)] == [0, 2, 0]  # 0 empty; then 0 and 2 tie at 1


def test_tasks_routed_during_a_read_are_not_forgotten() -> None:
    r = BacklogRouter(lambda: {}, 2)

    def slow_read() -> dict[int, int]:
        r.pick()  # routed while the read is in flight: not in what it returns
        return {0: 0, 1: 0}

    r._lag = slow_read
    r.refresh()
    assert sum(r.backlog()) == 1


def test_a_failing_read_keeps_the_estimate_and_is_counted() -> None:
    def broken() -> dict[int, int]:
        raise BusError("broker unreachable")

    r = BacklogRouter(broken, 2)
    r.refresh()
    r.refresh()
    assert r.read_errors == 2 and r.reads == 0
    assert [r.pick() for _ in range(4)] == [0, 1, 0, 1]


def test_the_pre_rollout_stage_sends_tasks_past_a_backed_up_partition(
        bus_url: str, tmp_path: Path, make_config: Callable[..., ExperimentConfig]) -> None:
    cfg = make_config({"commit_interval_s": 0.01, "batch_size": 8}, url=bus_url)
    bus = open_bus(cfg, tmp_path)
    tasks = topic_name(cfg.run, "tasks")
    p = bus.producer()
    for part in (2, 3):  # the consumer of partitions 2 and 3 has 10 tasks each to do
        for i in range(10):
            t = task(f"old{part}-{i}")
            p.produce(tasks, encode(t), key=t.id.encode(), headers=[schema_header(t)],
                      partition=part)
    p.flush()
    p.close()
    produce(bus, cfg.run, "tasks.raw", [task(f"new{i}") for i in range(8)])
    counters = run_configured_stage(cfg, "pre_rollout", bus=bus, max_records=8, timeout=60)
    assert counters["runner.in"] == 8 and counters["routing.reads"] >= 1
    ends = bus.describe_topic(tasks).end_offsets
    assert ends == {0: 4, 1: 4, 2: 10, 3: 10}
    released = [r.id for r in read_all(bus, tasks) if isinstance(r, Task)]
    assert sorted(x for x in released if x.startswith("new")) == sorted(
        f"new{i}" for i in range(8))
    bus.close()


def test_key_routing_is_still_there(bus_url: str, tmp_path: Path,
                                    make_config: Callable[..., ExperimentConfig]) -> None:
    cfg = make_config({"commit_interval_s": 0.01, "task_routing": "key"}, url=bus_url)
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, "tasks.raw", [task(f"k{i}") for i in range(16)])
    counters = run_configured_stage(cfg, "pre_rollout", bus=bus, max_records=16, timeout=60)
    assert "routing.reads" not in counters
    from astraflow.core.bus.partitioner import partition_for

    msgs = []
    c = bus.consumer("check", [topic_name(cfg.run, "tasks")], session_timeout=5)
    deadline = time.monotonic() + 30
    while len(msgs) < 16 and time.monotonic() < deadline:
        msgs.extend(c.consume(100, 1.0))
    c.close()
    assert len(msgs) == 16
    assert all(m.partition == partition_for(m.key, 4) for m in msgs)
    bus.close()
