"""The trainer as a bus consumer: batches.<policy> in, optimizer steps, weights out.

It never manages rollouts and waits for nothing but its own input topic. Each step:

1. wait for the next batch record (the time spent here is *waiting*; the rest is *busy*:
   ``wait_ratio = wait / (wait + busy)`` over the last steps is the ``w`` the scaler uses);
2. drop it if it is before the checkpointed offset or its id was trained already
   (redelivered or re-produced duplicates), dead-letter it if it cannot be decoded or is for
   another policy;
3. one optimizer step (``step_fn``): version v → v + 1;
4. every ``publish_every`` versions, hand the weights to the publisher (which blocks only for
   a copy);
5. every ``checkpoint_every`` versions, write a checkpoint holding the consumed offsets, and
   only then commit those offsets to the bus.

On start the newest checkpoint is loaded and the consumer is **seeked** to its offsets: the
checkpoint is the source of truth and the bus's commits only follow it, so after a crash
every batch after the checkpoint is trained again exactly once and none before it is. When
stopped (``max_steps``, ``timeout``, ``should_stop`` — the CLI sets it on SIGTERM) it
finishes the current step, checkpoints, commits, flushes the publisher and returns.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.consumers.trainer.checkpoint import CheckpointDir, TrainerState
from astraflow.consumers.trainer.engine import Engine
from astraflow.consumers.trainer.telemetry import Telemetry
from astraflow.core.bus.types import Bus, Consumer, Message
from astraflow.core.errors import AstraflowError, BusError, SchemaError
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import Batch, decode
from astraflow.core.stream import Output, dead_letter, resume_consumer, send
from astraflow.core.topics import topic_name

log = logging.getLogger("astraflow.trainer")

StepFn = Callable[[Engine, Batch, int], dict[str, float]]
TP = tuple[str, int]


class TrainerError(AstraflowError):
    """The trainer cannot start or go on (e.g. offsets committed without a checkpoint)."""


@dataclass
class TrainStats:
    """What one :meth:`Trainer.run` did."""

    steps: int = 0
    version: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    checkpoints: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0


class Trainer:
    """One policy's trainer on the bus. Lifecycle: ``setup()`` (or the first ``run``),
    ``run(...)`` as often as wanted, ``close()``. Build one with
    :func:`astraflow.consumers.trainer.build.build_trainer`."""

    def __init__(self, *, bus: Bus, run: str, policy: str, engine: Engine, step_fn: StepFn,
                 checkpoints: CheckpointDir, publisher: Any = None,
                 checkpoint_every: int = 50, publish_every: int = 1,
                 publish_initial: bool = False, max_version: int | None = None,
                 group: str | None = None, session_timeout: float = 10.0,
                 poll_timeout: float = 0.5, dedup_window: int = 10_000,
                 on_missing_checkpoint: str = "error", log_path: str | Path | None = None,
                 metrics: MetricsEmitter | None = None, component: str = "") -> None:
        self.bus = bus
        self.run_name = run
        self.policy = policy
        self.engine = engine
        self.step_fn = step_fn
        self.checkpoints = checkpoints
        self.publisher = publisher
        self.checkpoint_every = checkpoint_every
        self.publish_every = publish_every
        self.publish_initial = publish_initial
        self.max_version = max_version
        self.topic = topic_name(run, "batches", policy)
        self.dlq = topic_name(run, "dlq")
        self.group = group or f"af.{run}.trainer.{policy}"
        self.session_timeout = session_timeout
        self.poll_timeout = poll_timeout
        self.on_missing_checkpoint = on_missing_checkpoint
        self.component = component or f"trainer-{policy}"
        self.telemetry = Telemetry(metrics=metrics,
                                   log_path=Path(log_path) if log_path is not None else None)
        self.version = 0
        self.offsets: dict[TP, int] = {}  # next offset to train, per partition
        self.recent: deque[str] = deque(maxlen=dedup_window)  # ids of batches trained
        self._recent_set: set[str] = set()
        self._ckpt_offsets: dict[TP, int] = {}  # what the newest checkpoint holds
        self._checkpointed = 0  # version 0 (the model directory) needs no checkpoint
        self._published = 0  # ... and is what rollout workers start from
        self._consumer: Consumer | None = None
        self._producer: Any = None
        self._channel: Any = None  # rank 0 -> other ranks (data parallelism), see dist.py
        self._ready = False

    @property
    def metrics(self) -> MetricsEmitter | None:
        return self.telemetry.metrics

    @metrics.setter
    def metrics(self, emitter: MetricsEmitter | None) -> None:
        self.telemetry.metrics = emitter

    # ----------------------------------------------------------------------- lifecycle

    def setup(self) -> None:
        """Load the newest checkpoint, join the consumer group and seek to its offsets.
        Ranks > 0 of a data-parallel trainer only load the checkpoint."""
        if self._ready:
            return
        self._ready = True
        if self.engine.world > 1:
            from astraflow.consumers.trainer.dist import BatchChannel

            self._channel = BatchChannel(self.engine.device)
        state = self.checkpoints.load(self.engine.model, self.engine.optimizer)
        if self.engine.rank > 0:
            self.version = state.version if state is not None else 0
            return
        if state is None:
            committed = self.bus.committed(self.group, self.topic)
            if any(committed.values()) and self.on_missing_checkpoint == "error":
                raise TrainerError(
                    f"group {self.group} has committed offsets {committed} on {self.topic} but "
                    f"{self.checkpoints.root} holds no checkpoint: the checkpoint is the source "
                    "of truth for what was trained. Restore the checkpoint directory, start a "
                    "new run, or set trainer.on_missing_checkpoint: committed to train fresh "
                    "weights from the committed offsets")
        else:
            self.version = self._checkpointed = self._published = state.version
            self.offsets = {(t, p): o for t, parts in state.offsets.items()
                            for p, o in parts.items()}
            self._ckpt_offsets = dict(self.offsets)
            for bid in state.recent:
                self._remember(bid)
            self.telemetry.counters = dict(state.counters)
        self._producer = self.bus.producer(client_id=self.component)
        self._consumer = self._join()
        self.telemetry.open()
        self.telemetry.log({"event": "start", "version": self.version,
                            "resumed": state is not None, "time": time.time()})
        if state is None and self.publish_initial:
            self._publish()
        log.info("trainer policy=%s version=%d resumed=%s offsets=%s", self.policy,
                 self.version, state is not None, self.offsets)

    def _join(self) -> Consumer:
        # The offset guard in _accept skips what came before where a seek fails.
        return resume_consumer(self.bus, self.group, [self.topic], lambda: self.offsets,
                               client_id=self.component, session_timeout=self.session_timeout,
                               label=f"trainer policy={self.policy} ")

    def close(self) -> None:
        """Flush the publisher, leave the group, close files; rank 0 tells the other ranks
        to stop. Idempotent."""
        if self._channel is not None and self.engine.rank == 0:
            self._channel.send(None)
        self._channel = None
        if self.publisher is not None:
            self.publisher.flush()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush()
            self._producer.close()
            self._producer = None
        self.telemetry.close()

    # ----------------------------------------------------------------------------- run

    def run(self, max_steps: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> TrainStats:
        """Train until ``max_steps`` more steps, ``timeout`` seconds, ``should_stop()``, or
        the configured final version (``max_version``); then checkpoint and commit."""
        self.setup()
        stats = TrainStats(version=self.version)
        if self.engine.rank > 0:
            return self._follow(stats)
        assert self._consumer is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._done(stats, max_steps, should_stop):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                wait = self.poll_timeout if deadline is None else max(
                    0.0, min(self.poll_timeout, deadline - now))
                msgs = self._consumer.consume(1, wait)
                waited = time.monotonic() - now
                stats.wait_s += waited
                self.telemetry.waited(waited)
                if not msgs:
                    self.telemetry.tick()
                    continue
                batch = self._accept(msgs[0], stats)
                if batch is not None:
                    stats.busy_s += self._step(msgs[0], batch)
                    stats.steps += 1
            stats.checkpoints += self._finish()
        finally:
            stats.version = self.version
        return stats

    def _done(self, stats: TrainStats, max_steps: int | None,
              should_stop: Callable[[], bool] | None) -> bool:
        return ((should_stop is not None and should_stop())
                or (max_steps is not None and stats.steps >= max_steps)
                or (self.max_version is not None and self.version >= self.max_version))

    def _follow(self, stats: TrainStats) -> TrainStats:
        """Ranks > 0: train every batch rank 0 hands over until it says stop."""
        while (data := self._channel.recv()) is not None:
            self.step_fn(self.engine, decode(data, Batch), self.version)
            self.version += 1
            stats.steps += 1
        stats.version = self.version
        return stats

    def _accept(self, msg: Message, stats: TrainStats) -> Batch | None:
        """The batch in ``msg``, or None for a record to skip (counted, offset advanced)."""
        tp = (msg.topic, msg.partition)
        done = self.offsets.get(tp)
        if done is not None and msg.offset < done:
            stats.duplicates += 1
            self.telemetry.inc("skipped_before_checkpoint")
            return None
        try:
            batch = decode(msg.value, Batch)
            if batch.policy != self.policy:
                raise SchemaError(f"batch {batch.id!r} is for policy {batch.policy!r}, this "
                                  f"trainer trains {self.policy!r}")
        except SchemaError as e:
            stats.dead_lettered += 1
            self.telemetry.inc("dead_lettered")
            log.warning("dead-lettered origin=%s error=%s", msg.origin, e)
            send(self._producer, Output(self.dlq, dead_letter(
                msg, e, group=self.group, component=self.component), msg.key))
            self._producer.flush()
            self.offsets[tp] = msg.offset + 1
            return None
        if batch.id in self._recent_set:
            stats.duplicates += 1
            self.telemetry.inc("duplicates")
            log.info("skipping batch id=%s already trained (origin=%s)", batch.id, msg.origin)
            self.offsets[tp] = msg.offset + 1
            return None
        return batch

    def _step(self, msg: Message, batch: Batch) -> float:
        """Train, publish, checkpoint; returns the busy seconds."""
        started = time.monotonic()
        if self._channel is not None:
            self._channel.send(msg.value)
        metrics = self.step_fn(self.engine, batch, self.version)
        self.version += 1
        self.offsets[(msg.topic, msg.partition)] = msg.offset + 1
        self._remember(batch.id)
        step_s = time.monotonic() - started
        if self.version % self.publish_every == 0:
            self._publish()
        if self.version % self.checkpoint_every == 0:
            self._checkpoint()
        busy = time.monotonic() - started
        self.telemetry.step({
            "step": self.version, "time": time.time(), "batch_id": batch.id,
            "batch_seq": batch.seq, "origin": msg.origin, **metrics, "step_s": step_s,
            "tokens_per_s": metrics.get("tokens", 0.0) / max(step_s, 1e-9)}, busy)
        return busy

    def _finish(self) -> int:
        """At the end of a run: checkpoint what is not, publish the last version."""
        wrote = 0
        if self.version > self._checkpointed:
            self._checkpoint()
            wrote = 1
        else:
            self._commit()  # the bus may be behind the checkpoint we resumed from
        if self.publisher is not None:
            if self.version > self._published:
                self._publish()
            self.publisher.flush()
        self.telemetry.tick(force=True)
        return wrote

    # --------------------------------------------------------------------- effects

    def _publish(self) -> None:
        if self.publisher is None:
            return
        self.publisher.publish(self.engine.state_tensors(), self.version)
        self._published = self.version
        self.telemetry.inc("published")

    def _checkpoint(self) -> None:
        offsets: dict[str, dict[int, int]] = {}
        for (t, p), o in self.offsets.items():
            offsets.setdefault(t, {})[p] = o
        state = TrainerState(version=self.version, offsets=offsets, recent=list(self.recent),
                             counters=dict(self.telemetry.counters))
        self.checkpoints.save(self.engine.model, self.engine.optimizer, state)
        self._checkpointed = self.version
        self._ckpt_offsets = dict(self.offsets)
        self.telemetry.inc("checkpoints")
        self._commit()

    def _commit(self) -> None:
        """Commit the offsets of the newest checkpoint: the bus never runs ahead of it."""
        assert self._consumer is not None
        msgs = [Message(t, p, o - 1, None, b"") for (t, p), o in self._ckpt_offsets.items()
                if o > 0]
        if not msgs:
            return
        try:
            self._consumer.commit(msgs)
        except BusError as e:  # the checkpoint holds the offsets; the bus catches up later
            log.warning("commit refused (%s); the checkpoint keeps the offsets", e)

    def _remember(self, batch_id: str) -> None:
        if len(self.recent) == self.recent.maxlen:
            self._recent_set.discard(self.recent[0])
        self.recent.append(batch_id)
        self._recent_set.add(batch_id)
