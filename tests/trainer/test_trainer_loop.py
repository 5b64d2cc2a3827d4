"""The trainer on the bus: publishes, checkpoints, commits only with a checkpoint, seeks to
the checkpoint on restart, drops duplicates, dead-letters what it cannot train on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import produce, random_batch

from astraflow.consumers.trainer.loop import TrainerError
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.records import DeadLetter, WeightManifest, decode
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import build_trainer
from astraflow.weights import FileStore, Publisher


def read_all(bus: Any, topic: str, kind: type) -> list[Any]:
    consumer = bus.consumer(f"reader-{topic}", [topic])
    out: list[Any] = []
    end = sum(bus.describe_topic(topic).end_offsets.values())
    for _ in range(50):
        if len(out) >= end:
            break
        out.extend(decode(m.value, kind) for m in consumer.consume(100, 0.2))
    consumer.close()
    return out


def test_trains_publishes_checkpoints_and_commits(experiment: Any, tmp_path: Path,
                                                  bus_url: str) -> None:
    cfg = experiment(trainer={"checkpoint_every": 2, "max_steps": 5, "publish_every": 1},
                     url=bus_url)
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(6)])
    publisher = Publisher(bus, run=cfg.run, policy="default",
                          store=FileStore(tmp_path / "weights"))
    trainer = build_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
    committed: list[dict[int, int]] = []

    def step(engine: Any, batch: Any, version: int) -> dict[str, float]:
        committed.append(bus.committed(trainer.group, trainer.topic))
        return rl_step(engine, batch, version)

    trainer.step_fn = step
    stats = trainer.run(timeout=60)
    trainer.close()
    publisher.close()
    assert stats.steps == 5 and stats.version == 5  # max_steps is the final version
    # offsets are committed only together with a checkpoint (every 2 steps, and at the end)
    assert committed == [{}, {}, {0: 2}, {0: 2}, {0: 4}]
    assert bus.committed(trainer.group, trainer.topic) == {0: 5}
    assert trainer.checkpoints.versions() == [5, 4]  # keep_checkpoints: 2
    manifests = read_all(bus, topic_name(cfg.run, "weights", "default"), WeightManifest)
    assert sorted({m.version for m in manifests}) == [1, 2, 3, 4, 5]
    assert all(t.dtype == "bfloat16" for m in manifests for t in m.tensors)
    log = [json.loads(x) for x in (tmp_path / "trainer-default.jsonl").read_text().splitlines()]
    rows = [r for r in log if "step" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for key in ("loss", "reward_mean", "adv_std", "clip_frac", "entropy", "grad_norm",
                "train_tokens_per_s", "wait_ratio", "staleness_mean", "behav_weight_mean"):
        assert all(key in r for r in rows), key


def test_restart_seeks_to_the_checkpoint(experiment: Any, tmp_path: Path,
                                        bus_url: str) -> None:
    """A crash after a checkpoint but before its commit: the bus is behind, the checkpoint
    is the truth, and the restarted trainer trains each later batch exactly once."""
    cfg = experiment(trainer={"checkpoint_every": 2}, url=bus_url)
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(5)])
    first = build_trainer(cfg, "default", tmp_path, bus=bus)
    first._commit = lambda: None  # type: ignore[method-assign]  # the crash before commit

    class Crash(Exception):
        pass

    def crash_at_3(engine: Any, batch: Any, version: int) -> dict[str, float]:
        if version == 3:
            raise Crash
        return rl_step(engine, batch, version)

    first.step_fn = crash_at_3
    with pytest.raises(Crash):
        first.run(timeout=60)
    first.close()
    assert first.checkpoints.versions() == [2]
    assert bus.committed(first.group, first.topic) == {}

    second = build_trainer(cfg, "default", tmp_path, bus=bus)
    seen: list[tuple[int, str]] = []

    def record(engine: Any, batch: Any, version: int) -> dict[str, float]:
        seen.append((version, batch.id))
        return rl_step(engine, batch, version)

    second.step_fn = record
    stats = second.run(max_steps=3, timeout=60)
    second.close()
    assert seen == [(2, "default-2"), (3, "default-3"), (4, "default-4")]
    assert stats.version == 5
    assert bus.committed(second.group, second.topic) == {0: 5}


def test_duplicates_and_bad_records(experiment: Any, tmp_path: Path) -> None:
    cfg = experiment(trainer={"checkpoint_every": 10})
    bus = open_bus(cfg, tmp_path)
    topic = topic_name(cfg.run, "batches", "default")
    produce(bus, cfg.run, [random_batch(0), random_batch(0)])  # same id twice
    producer = bus.producer()
    producer.produce(topic, b"not msgpack", key=b"default")
    producer.flush()
    produce(bus, cfg.run, [random_batch(1, policy="other"), random_batch(1)])
    trainer = build_trainer(cfg, "default", tmp_path, bus=bus)
    stats = trainer.run(max_steps=2, timeout=60)
    trainer.close()
    assert stats.steps == 2
    assert stats.duplicates == 1 and stats.dead_lettered == 2
    dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert sorted(d.offset for d in dead) == [2, 3]
    assert bus.committed(trainer.group, topic) == {0: 5}
    # a restart trains nothing again: the dedup ids and the offsets are in the checkpoint
    produce(bus, cfg.run, [random_batch(1)])
    again = build_trainer(cfg, "default", tmp_path, bus=bus)
    stats = again.run(timeout=1.0)
    again.close()
    assert stats.steps == 0 and stats.duplicates == 1


def test_committed_offsets_without_checkpoint_is_an_error(experiment: Any,
                                                           tmp_path: Path) -> None:
    cfg = experiment(trainer={"checkpoint_every": 1})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(0)])
    trainer = build_trainer(cfg, "default", tmp_path, bus=bus)
    trainer.run(max_steps=1, timeout=60)
    trainer.close()
    for v in trainer.checkpoints.versions():
        import shutil

        shutil.rmtree(trainer.checkpoints.path(v))
    fresh = build_trainer(cfg, "default", tmp_path, bus=bus)
    with pytest.raises(TrainerError, match="source of truth"):
        fresh.setup()
    fresh.close()
    cfg.trainer.on_missing_checkpoint = "committed"
    lenient = build_trainer(cfg, "default", tmp_path, bus=bus)
    lenient.setup()
    assert lenient.version == 0
    lenient.close()


def test_a_restarted_trainer_continues_the_weight_chain(experiment: Any, tmp_path: Path,
                                                        bus_url: str) -> None:
    """After a restart from its checkpoint the trainer publishes the next version as a delta
    against the checkpoint's weights (which its predecessor published), not as a full: far
    workers keep fetching deltas across a trainer crash."""
    cfg = experiment(trainer={"checkpoint_every": 2, "publish_every": 1}, url=bus_url)
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(6)])
    topic = topic_name(cfg.run, "weights", "default")
    for run_steps in (4, 2):  # a first trainer, then one restarted from its checkpoint at 4
        publisher = Publisher(bus, run=cfg.run, policy="default",
                              store=FileStore(tmp_path / "weights"), full_every=100)
        trainer = build_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
        trainer.run(max_steps=run_steps, timeout=60)
        trainer.close()
        publisher.close()
    manifests = read_all(bus, topic, WeightManifest)
    kinds = [(m.version, m.kind) for m in manifests]
    assert (5, "full") not in kinds and (5, "delta") in kinds and (6, "delta") in kinds, kinds
    by = {(m.version, m.kind): m for m in manifests}
    four, five = by[(4, "delta")], by[(5, "delta")]
    assert [t.base_digest for t in five.tensors] == [t.digest for t in four.tensors]
