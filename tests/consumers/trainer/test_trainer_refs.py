"""Batches by reference: the trainer fetches the trajectories a batch names and trains exactly
as on copies; a batch naming records that are gone is dead-lettered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from test_trainer_loop import read_all
from trainer_helpers import produce, random_batch

from astraflow.core.records import Batch, DeadLetter, Group, TrajRef, encode, schema_header
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_trainer


def by_reference(bus: Any, run: str, batch: Batch) -> Batch:
    """Put the batch's trajectories on the run's trajectories topic, as rollout workers do,
    and return the batch as the batcher makes it: references, no copies."""
    topic = topic_name(run, "trajectories")
    producer = bus.producer()
    for g in batch.groups:
        for t in g.trajectories:
            producer.produce(topic, encode(t), key=t.group_id.encode(), headers=[schema_header(t)])
    producer.flush()
    where = {}
    ends = bus.describe_topic(topic).end_offsets
    reader = bus.reader(topic, start="earliest")
    while sum(reader.position(p) for p in ends) < sum(ends.values()):
        for m in reader.consume(500, 0.5):
            where[m.value] = (m.partition, m.offset)
    reader.close()
    groups = []
    for g in batch.groups:
        refs = [TrajRef(t.id, topic, *where[encode(t)], i, t.reward)
                for i, t in enumerate(g.trajectories)]
        groups.append(Group(group_id=g.group_id, task_id=g.task_id, refs=refs))
    return Batch(id=batch.id, policy=batch.policy, seq=batch.seq, groups=groups)


def weights_after(cfg: Any, out: Path, batches: list[Batch]) -> dict[str, torch.Tensor]:
    bus = open_bus(cfg, out)
    refs = [by_reference(bus, cfg.run, b) if i % 2 else b for i, b in enumerate(batches)]
    produce(bus, cfg.run, refs if out.name == "refs" else batches)
    trainer = configured_trainer(cfg, "default", out, bus=bus)
    stats = trainer.run(max_steps=len(batches), timeout=120)
    weights = {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()}
    trainer.close()
    bus.close()
    assert stats.steps == len(batches) and stats.dead_lettered == 0
    return weights


def test_training_on_references_equals_training_on_copies(experiment: Any,
                                                          tmp_path: Path) -> None:
    batches = [random_batch(s) for s in range(4)]
    copies = weights_after(experiment(trainer={"checkpoint_every": 2}), tmp_path / "copies",
                           batches)
    refs = weights_after(experiment(trainer={"checkpoint_every": 2}), tmp_path / "refs",
                         batches)
    assert copies.keys() == refs.keys()
    for k in copies:
        assert torch.equal(copies[k], refs[k]), k


def test_a_batch_whose_records_are_gone_is_dead_lettered(experiment: Any,
                                                         tmp_path: Path) -> None:
    cfg = experiment()
    bus = open_bus(cfg, tmp_path)
    good = by_reference(bus, cfg.run, random_batch(0))
    bad = Batch(id="default-1", policy="default", seq=1, groups=[Group(
        group_id="g", task_id="t",
        refs=[TrajRef("x", topic_name(cfg.run, "trajectories"), 0, 10_000, 0, 1.0)])])
    wrong = Batch(id="default-2", policy="default", seq=2, groups=[Group(
        group_id="g2", task_id="t", refs=[TrajRef("not-this-one", *_addr(good), 0, 1.0)])])
    produce(bus, cfg.run, [good, bad, wrong])
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = trainer.run(max_steps=1, timeout=20)
    trainer.run(timeout=3)
    trainer.close()
    assert stats.steps == 1
    dead = read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter)
    assert sorted(d.offset for d in dead) == [1, 2]
    assert "no record at" in dead[0].error or "no record at" in dead[1].error
    assert any("the reference names 'not-this-one'" in d.error for d in dead)
    bus.close()


def _addr(batch: Batch) -> tuple[str, int, int]:
    r = batch.groups[0].refs[0]
    return r.topic, r.partition, r.offset


def test_a_bus_error_while_fetching_is_not_a_dead_letter(experiment: Any,
                                                         tmp_path: Path) -> None:
    """The bus failing while a batch's records are fetched (Kafka right after a broker restart:
    "reading the offsets of ...trajectories[25] failed: Unknown partition") is not the records
    being gone: the trainer stops (and, restarted, trains the batch) instead of dead-lettering
    it. Before, fetch called any error opening its reader "no longer on the bus", and the
    batch's 512 trajectories were skipped for good while the accounting counted them trained
    (found by bench/chaos.py: its replay had one batch more than the trainer's version)."""
    import contextlib

    from astraflow.core.errors import BusError

    cfg = experiment()
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [by_reference(bus, cfg.run, random_batch(0))])
    real = bus.reader
    fail = [True]

    def flaky(topic: str, *args: Any, **kwargs: Any) -> Any:
        if fail[0] and topic.endswith(".trajectories"):
            fail[0] = False
            raise BusError(f"reading the offsets of {topic}[0] failed: Failed to get watermark "
                           "offsets: Local: Unknown partition; is the broker running?")
        return real(topic, *args, **kwargs)

    bus.reader = flaky  # type: ignore[method-assign]
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    with contextlib.suppress(BusError):  # the role exits; the supervisor restarts it
        trainer.run(max_steps=1, timeout=20)
    trainer.close()
    assert read_all(bus, topic_name(cfg.run, "dlq"), DeadLetter) == []
    again = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = again.run(max_steps=1, timeout=20)
    again.close()
    assert stats.steps == 1 and stats.dead_lettered == 0
    bus.close()
