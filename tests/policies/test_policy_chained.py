"""Every policy chained, on the embedded bus and on Kafka: three stage processors, a fake
rollout worker and a fake trainer, closing the loop through the topics."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from policy_helpers import end_count, group_trajs, manifest, produce, read_all, task
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.core.records import Batch, Task, decode
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import run_configured_stage

DATA = {
    "pre_rollout": ["gate", "greso"],
    "post_rollout": ["assembler", "staleness", "dynamic_sampling"],
    "batch": ["replay", "batcher"],
    "batch_size": 2, "max_staleness": 1, "commit_interval_s": 0.05, "session_timeout_s": 6.0,
    "assembler": {"group_size": 2},
    "staleness": {"max_staleness": 100},
    "greso": {"p_easy": 0.0, "floor_easy": 0.0, "warmup_steps": 1000},
    "replay": {"ratio": 0.5, "max_staleness": 100, "max_uses": 1},
}


def easy(i: int) -> bool:
    return i % 3 == 0


def test_all_policies_chained(bus_url: str, make_config: Callable[..., ExperimentConfig],
                              tmp_path: Path) -> None:
    cfg = make_config(DATA, url=bus_url)
    run = cfg.run
    bus = open_bus(cfg, tmp_path)
    stop = threading.Event()
    errors: list[BaseException] = []
    counters: dict[str, dict[str, float]] = {}

    def stage(name: str) -> None:
        try:
            counters[name] = run_configured_stage(cfg, name, out=tmp_path, should_stop=stop.is_set)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test thread
            errors.append(e)

    threads = [threading.Thread(target=stage, args=(s,), daemon=True)
               for s in ("pre_rollout", "post_rollout", "batch")]
    for t in threads:
        t.start()
    rollout = bus.consumer(f"rollout-{uuid.uuid4().hex[:6]}", [topic_name(run, "tasks")])
    trainer = bus.consumer(f"trainer-{uuid.uuid4().hex[:6]}",
                           [topic_name(run, "batches", "default")])
    producer = bus.producer()
    version = 0
    rolled: set[str] = set()
    batches: dict[str, Batch] = {}

    def step() -> None:
        """One round of the fake rollout worker and the fake trainer."""
        nonlocal version
        assert not errors, errors
        for m in rollout.consume(100, 0.02):
            t = decode(m.value, Task)
            if t.resolved_group_id() in rolled:
                continue
            rolled.add(t.resolved_group_id())
            i = int(t.id[1:])
            rewards = [1.0, 1.0] if easy(i) else [1.0, 0.0]
            trajs = group_trajs(t.resolved_group_id(), rewards, version=version, task=t.id)
            produce(bus, run, "trajectories", trajs)
        rollout.commit()
        for m in trainer.consume(100, 0.02):
            b = decode(m.value, Batch)
            if b.id not in batches:
                batches[b.id] = b
                version += 1
                produce(bus, run, "weights", [manifest(version)], policy="default")
        trainer.commit()

    def until(cond: Callable[[], bool], what: str) -> None:
        def poll() -> bool:
            step()
            return cond()
        wait_for(poll, 90, what, every=0.0)

    try:
        tasks = [task(f"t{i}", n=2, group_id=f"t{i}#e1") for i in range(24)]
        produce(bus, run, "tasks.raw", tasks)
        # 16 mixed groups: the first batch takes 2 fresh, each next one 1 fresh + 1 replayed
        until(lambda: len(batches) >= 15, "15 batches of epoch 1")
        side = f"af.{run}.policy.pre_rollout.side"
        stats_topic = topic_name(run, "stats")
        until(lambda: sum(bus.committed(side, stats_topic).values()) >= 24,
              "GRESO to read every GroupStats of epoch 1")
        produce(bus, run, "tasks.raw", [task(f"t{i}", n=2, group_id=f"t{i}#e2")
                                        for i in range(24)])
        until(lambda: len(batches) >= 31, "31 batches")
        # the gate has seen every group come back (stats alone: it reads no groups topic)
        until(lambda: sum(bus.committed(side, stats_topic).values())
              >= end_count(bus, stats_topic), "the gate to read every GroupStats")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        rollout.close()
        trainer.close()
        producer.close()
    assert not errors, errors

    assert sorted(batches) == sorted(f"default-{i}" for i in range(31))
    assert all(len(b.groups) == 2 and len({g.group_id for g in b.groups}) == 2
               for b in batches.values())
    fresh = Counter(g.group_id for b in batches.values() for g in b.groups if not g.replayed)
    mixed = {f"t{i}#e{e}" for i in range(24) if not easy(i) for e in (1, 2)}
    assert set(fresh) == mixed and max(fresh.values()) == 1
    assert sum(g.replayed for b in batches.values() for g in b.groups) == 30
    for b in batches.values():  # dynamic sampling: no zero-variance group is trained on
        for g in b.groups:
            assert len(set(g.rewards())) == 2
    # GRESO skipped the 8 easy tasks of epoch 2 (z = 1, p_easy = 0): 24 + 16 released
    released = {t.resolved_group_id() for t in read_all(bus, topic_name(run, "tasks"))}
    assert released == {f"t{i}#e1" for i in range(24)} | mixed
    assert end_count(bus, topic_name(run, "stats")) >= 40
    assert end_count(bus, topic_name(run, "dlq")) == 0
    pre = counters["pre_rollout"]
    assert pre["gate.released"] == 40 and pre["greso.skipped_easy"] == 8
    assert pre["gate.accepted"] == 32 and pre["gate.in_flight"] == 0
    assert pre["gate.dropped"] == 8  # the easy groups dynamic sampling dropped: kept=False
    stats = [r for r in read_all(bus, stats_topic) if r.group_id in released]
    assert {r.group_id for r in stats if not r.kept} == {f"t{i}#e1" for i in range(24)
                                                          if easy(i)}
    assert counters["post_rollout"]["dynamic_sampling.dropped_easy"] == 8
    bus.close()
