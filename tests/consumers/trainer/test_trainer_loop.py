"""The trainer on the bus: publishes, checkpoints, commits only with a checkpoint, seeks to
the checkpoint on restart, drops duplicates, dead-letters what it cannot train on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from trainer_helpers import produce, random_batch

from astraflow.consumers.trainer.loop import TrainerError
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.records import DeadLetter, WeightManifest, decode, pack_i32
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_trainer
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
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
    committed: list[dict[int, int]] = []

    def step(state: Any, batch: Any, version: int) -> dict[str, float]:
        committed.append(bus.committed(trainer.group, trainer.topic))
        return rl_step(state, batch, version)

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
    first = configured_trainer(cfg, "default", tmp_path, bus=bus)
    first._commit = lambda: None  # type: ignore[method-assign]  # the crash before commit

    class Crash(BaseException):  # the process dies: no exception the trainer may catch
        pass

    def crash_at_3(state: Any, batch: Any, version: int) -> dict[str, float]:
        if version == 3:
            raise Crash
        return rl_step(state, batch, version)

    first.step_fn = crash_at_3
    with pytest.raises(Crash):
        first.run(timeout=60)
    first.close()
    assert first.checkpoints.versions() == [2]
    assert bus.committed(first.group, first.topic) == {}

    second = configured_trainer(cfg, "default", tmp_path, bus=bus)
    seen: list[tuple[int, str]] = []

    def record(state: Any, batch: Any, version: int) -> dict[str, float]:
        seen.append((version, batch.id))
        return rl_step(state, batch, version)

    second.step_fn = record
    stats = second.run(max_steps=3, timeout=60)
    second.close()
    assert seen == [(2, "default-2"), (3, "default-3"), (4, "default-4")]
    assert stats.version == 5
    assert bus.committed(second.group, second.topic) == {0: 5}


def test_a_batch_that_makes_the_step_raise_is_quarantined_and_training_goes_on(
        experiment: Any, tmp_path: Path) -> None:
    """A poison batch is tried max_batch_tries times, then dead-lettered with its error, and
    the next batches train; a restart from the checkpoint before it (the process died on a
    later batch before checkpointing) does not try it again, nor dead-letter it twice."""
    cfg = experiment(trainer={"checkpoint_every": 1, "max_batch_tries": 2})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(4)])
    tries: list[str] = []

    class Killed(BaseException):  # the process dies: no exception the trainer may catch
        pass

    def poisoned(state: Any, batch: Any, version: int) -> dict[str, float]:
        tries.append(batch.id)
        if batch.id == "default-1":
            raise IndexError("index out of range in self")  # what an embedding raises
        if batch.id == "default-2" and len(tries) == 4:
            raise Killed
        return rl_step(state, batch, version)

    first = configured_trainer(cfg, "default", tmp_path, bus=bus)
    first.step_fn = poisoned
    first._commit = lambda: None  # type: ignore[method-assign]  # the bus lags the checkpoint
    with pytest.raises(Killed):
        first.run(timeout=60)
    first.close()
    assert tries == ["default-0", "default-1", "default-1", "default-2"]
    assert first.checkpoints.versions() == [1]  # the poison moved no version
    dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert [(d.offset, d.error_type) for d in dead] == [(1, "PoisonBatchError")]
    assert "failed 2 times" in dead[0].error and "IndexError" in dead[0].error

    tries.clear()
    second = configured_trainer(cfg, "default", tmp_path, bus=bus)
    second.step_fn = poisoned
    stats = second.run(max_steps=2, timeout=60)
    second.close()
    assert tries == ["default-2", "default-3"]
    assert stats.steps == 2 and stats.version == 3
    assert len(read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)) == 1
    assert bus.committed(second.group, second.topic) == {0: 4}


def test_a_batch_whose_tries_killed_the_process_is_quarantined_on_restart(
        experiment: Any, tmp_path: Path) -> None:
    """Tries that end the process (a native crash, the OOM killer) count too: the tries are
    on disk before each one, so the restart after the last dead-letters the batch untried."""
    cfg = experiment(trainer={"checkpoint_every": 100, "max_batch_tries": 2})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(2)])

    class Killed(BaseException):  # as far as the trainer knows, its process died here
        pass

    def dies(state: Any, batch: Any, version: int) -> dict[str, float]:
        raise Killed

    for _ in range(2):
        t = configured_trainer(cfg, "default", tmp_path, bus=bus)
        t.step_fn = dies
        with pytest.raises(Killed):
            t.run(timeout=60)
        t.close()
    last = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = last.run(max_steps=1, timeout=60)
    last.close()
    assert stats.steps == 1 and stats.version == 1 and stats.dead_lettered == 1
    dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert [(d.offset, d.error_type) for d in dead] == [(0, "PoisonBatchError")]
    assert "2 tries each ended the trainer's process" in dead[0].error


def test_untrustworthy_trajectories_of_a_batch_are_dropped_before_the_step(
        experiment: Any, tmp_path: Path) -> None:
    """A batch record written past the stages (anyone can produce): its trajectories are
    checked against the loaded model's vocabulary and the reward rules before the step. The
    bad ones are dropped (counted), the rest train with a finite loss; a batch with nothing
    left is dead-lettered with the reason. Before, the out-of-vocabulary id raised IndexError
    on every try and ended the run."""
    cfg = experiment(trainer={"checkpoint_every": 100})
    bus = open_bus(cfg, tmp_path)
    mixed = random_batch(0)
    first = mixed.groups[0].trajectories
    first[0] = msgspec.structs.replace(first[0], token_ids=pack_i32(
        [999999] * (len(first[0].token_ids) // 4)))
    first[1] = msgspec.structs.replace(first[1], reward=float("nan"))
    first[2] = msgspec.structs.replace(first[2], reward=1e308)
    hopeless = random_batch(1)
    for g in hopeless.groups:
        g.trajectories = [msgspec.structs.replace(t, reward=float("inf"))
                          for t in g.trajectories]
    produce(bus, cfg.run, [mixed, hopeless, random_batch(2)])
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = trainer.run(max_steps=2, timeout=60)
    trainer.close()
    assert stats.steps == 2 and stats.dead_lettered == 1
    (dead,) = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert dead.offset == 1 and "no trajectory can be trained" in dead.error
    assert "reward is inf" in dead.error
    rows = [json.loads(x) for x in (tmp_path / "trainer-default.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    assert [r["batch_id"] for r in steps] == ["default-0", "default-2"]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert trainer.telemetry.counters["dropped_invalid"] == 3 + 16  # the hopeless batch: 16


def test_duplicates_and_bad_records(experiment: Any, tmp_path: Path) -> None:
    cfg = experiment(trainer={"checkpoint_every": 10})
    bus = open_bus(cfg, tmp_path)
    topic = topic_name(cfg.run, "batches", "default")
    produce(bus, cfg.run, [random_batch(0), random_batch(0)])  # same id twice
    producer = bus.producer()
    producer.produce(topic, b"not msgpack", key=b"default")
    producer.flush()
    produce(bus, cfg.run, [random_batch(1, policy="other"), random_batch(1)])
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = trainer.run(max_steps=2, timeout=60)
    trainer.close()
    assert stats.steps == 2
    assert stats.duplicates == 1 and stats.dead_lettered == 2
    dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert sorted(d.offset for d in dead) == [2, 3]
    assert bus.committed(trainer.group, topic) == {0: 5}
    # a restart trains nothing again: the dedup ids and the offsets are in the checkpoint
    produce(bus, cfg.run, [random_batch(1)])
    again = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = again.run(timeout=1.0)
    again.close()
    assert stats.steps == 0 and stats.duplicates == 1


def test_committed_offsets_without_checkpoint_is_an_error(experiment: Any,
                                                           tmp_path: Path) -> None:
    cfg = experiment(trainer={"checkpoint_every": 1})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(0)])
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    trainer.run(max_steps=1, timeout=60)
    trainer.close()
    for v in trainer.checkpoints.versions():
        import shutil

        shutil.rmtree(trainer.checkpoints.path(v))
    fresh = configured_trainer(cfg, "default", tmp_path, bus=bus)
    with pytest.raises(TrainerError, match="source of truth"):
        fresh.setup()
    fresh.close()
    cfg.trainer.on_missing_checkpoint = "committed"
    lenient = configured_trainer(cfg, "default", tmp_path, bus=bus)
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
        trainer = configured_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
        trainer.run(max_steps=run_steps, timeout=60)
        trainer.close()
        publisher.close()
    manifests = read_all(bus, topic, WeightManifest)
    kinds = [(m.version, m.kind) for m in manifests]
    assert (5, "full") not in kinds and (5, "delta") in kinds and (6, "delta") in kinds, kinds
    by = {(m.version, m.kind): m for m in manifests}
    four, five = by[(4, "delta")], by[(5, "delta")]
    assert [t.base_digest for t in five.tensors] == [t.digest for t in four.tensors]
