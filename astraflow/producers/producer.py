"""The task producer: a dataset or generator → Task records on ``tasks.raw`` (or ``tasks``).

Every task gets ``n_samples`` (the group size), the workflow name, and a group id per
(task, attempt): ``"{task id}#{attempt}"``, where the attempt counts how often the same task id
was released by this source (epochs, or a synthetic count larger than its split). Ids are
deterministic, so a re-run produces the same records; with ``skip_existing`` (the default) it
first reads the topic and skips every group already there, so re-running after a crash or
twice produces nothing twice. Records are keyed by task id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.core.bus.reader import read_all
from astraflow.core.bus.types import Bus
from astraflow.core.errors import SchemaError
from astraflow.core.records import Task, decode
from astraflow.core.stream import Output, send
from astraflow.core.topics import record_key, topic_name
from astraflow.producers.arithmetic import arithmetic
from astraflow.producers.sources import SourceError, TaskSpec, with_system
from astraflow.producers.splits import split_specs, task_name

if TYPE_CHECKING:
    from astraflow.producers.config import ProducerConfig

log = logging.getLogger("astraflow.producer")


@dataclass
class ProduceStats:
    produced: int = 0
    skipped: int = 0  # groups already on the topic
    seconds: float = 0.0
    waited_s: float = 0.0  # spent waiting for the topic's reader (``producer.max_lead``)


def specs(pc: ProducerConfig, out: str | Path = ".") -> Iterator[TaskSpec]:
    """The source's tasks in order, one pass: its train split (:func:`split_specs`), but for
    arithmetic, whose ``producer.arithmetic.split`` and ``count`` say what it releases."""
    if pc.source == "arithmetic":
        for spec, _repeat in arithmetic(pc.arithmetic, dataset=pc.dataset or "arith"):
            yield spec
        return
    yield from split_specs(pc, "train", out)


def tasks(pc: ProducerConfig, out: str | Path = ".") -> Iterator[Task]:
    """Task records for ``epochs`` passes over the source."""
    attempts: dict[str, int] = {}
    name = task_name(pc)
    for _epoch in range(pc.epochs):
        for spec in specs(pc, out):
            attempt = attempts.get(spec.id, 0)
            attempts[spec.id] = attempt + 1
            prompt = with_system(spec.prompt, pc.system_prompt)
            # a file source's rows carry their file's stem (several files: several names)
            dataset = (spec.id.split(":", 1)[0] if pc.source in ("jsonl", "parquet")
                       and not pc.dataset else name)
            yield Task(id=spec.id, dataset=dataset, prompt=prompt, reference=spec.reference,
                       workflow=pc.workflow, n_samples=pc.n_samples, attempt=attempt,
                       group_id=f"{spec.id}#{attempt}", metadata=dict(spec.metadata))


def existing_groups(bus: Bus, topic: str, *, timeout: float = 120.0) -> set[str]:
    """Group ids of every Task on ``topic`` now (read from the beginning by a group-less
    reader: a producer restart leaves no consumer group behind)."""
    groups: set[str] = set()
    deadline = time.monotonic() + timeout
    for msg in read_all(bus, topic, client_id="producer-scan"):
        if time.monotonic() > deadline:
            raise SourceError(f"reading {topic} to skip existing groups took over {timeout:g} s;"
                              " set producer.skip_existing=false to produce without the check")
        try:
            groups.add(decode(msg.value, Task).resolved_group_id())
        except SchemaError:
            continue
    return groups


def wait_for_reader(bus: Bus, topic: str, group: str, max_lead: int,
                    should_stop: Callable[[], bool] | None = None) -> float:
    """Sleep until ``group`` has fewer than ``max_lead`` records of ``topic`` left to commit
    (or until told to stop); the seconds waited."""
    start = time.monotonic()
    delay = 0.05
    told = False
    while sum(bus.lag(group, topic).values()) >= max_lead:
        if should_stop is not None and should_stop():
            break
        if not told:
            log.info("%d or more tasks on %s ahead of %s: waiting for it (producer.max_lead)",
                     max_lead, topic, group)
            told = True
        time.sleep(delay)
        delay = min(1.0, delay * 2)
    return time.monotonic() - start


def produce_tasks(bus: Bus, pc: ProducerConfig, *, run: str, out: str | Path = ".",
                  max_tasks: int | None = None, should_stop: Callable[[], bool] | None = None,
                  client_id: str = "producer", reader: str | None = None,
                  progress: Callable[[ProduceStats], None] | None = None) -> ProduceStats:
    """Produce the source's tasks to the run's topic; flushes. ``reader``: the consumer
    group that reads the topic; at each flush the producer waits while it has
    ``producer.max_lead`` tasks or more left to take (None: no wait). ``progress`` is called
    with the counts after every task (and at the end), for live metrics."""
    start = time.monotonic()
    topic = topic_name(run, pc.topic)
    existing = existing_groups(bus, topic) if pc.skip_existing else set()
    limits = [x for x in (max_tasks, pc.max_tasks) if x is not None]
    limit = min(limits) if limits else None
    stats = ProduceStats()
    producer = bus.producer(client_id=client_id)
    next_at = time.monotonic()
    try:
        for task in tasks(pc, out):
            if limit is not None and stats.produced >= limit:
                break
            if should_stop is not None and should_stop():
                break
            if task.group_id in existing:
                stats.skipped += 1
                if progress is not None:
                    progress(stats)
                continue
            if pc.rate_limit:
                next_at += 1.0 / pc.rate_limit
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            send(producer, Output(topic, task, record_key(pc.topic, task)))
            stats.produced += 1
            if stats.produced % pc.flush_every == 0:
                producer.flush()
                if reader is not None and pc.max_lead is not None:
                    stats.waited_s += wait_for_reader(bus, topic, reader, pc.max_lead,
                                                      should_stop)
            if progress is not None:
                progress(stats)
        producer.flush()
    finally:
        producer.close()
    stats.seconds = time.monotonic() - start
    log.info("produced=%d skipped=%d topic=%s seconds=%.2f waited_s=%.2f", stats.produced,
             stats.skipped, topic, stats.seconds, stats.waited_s)
    return stats


def produce(bus: Bus, pc: ProducerConfig, *, run: str, out: str | Path = ".",
            max_tasks: int | None = None, should_stop: Callable[[], bool] | None = None,
            reader: str | None = None) -> ProduceStats:
    """``astraflow produce``: :func:`produce_tasks` on the run's bus (whose topics exist),
    reporting its counters to ``metrics``."""
    from astraflow.core.metrics import MetricsEmitter

    metrics = MetricsEmitter(bus, run=run, role="producer")

    def progress(stats: ProduceStats) -> None:  # counters while producing, not only at the end
        metrics.set_total("tasks_produced", stats.produced)
        metrics.set_total("tasks_skipped", stats.skipped)
        metrics.tick()

    try:
        stats = produce_tasks(bus, pc, run=run, out=out, max_tasks=max_tasks,
                              should_stop=should_stop, client_id=metrics.component,
                              reader=reader, progress=progress)
        progress(stats)
    finally:
        metrics.close("stopped")
    return stats
