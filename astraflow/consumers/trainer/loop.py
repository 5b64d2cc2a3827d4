"""The trainer as a bus consumer: batches.<policy> in, optimizer steps, weights out.

Each batch is one optimizer step (version v → v + 1); duplicates are skipped, batches that do
not decode or are for another policy dead-lettered. Weights are published every
``publish_every`` versions; every ``checkpoint_every`` a checkpoint is written and only then
are its offsets committed. The checkpoint is the source of truth: on start the consumer seeks
to its offsets. Stopped (``max_steps``, ``timeout``, ``should_stop``), it finishes the step,
checkpoints, commits and flushes (docs/trainer.md#checkpoints-and-resume).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointMeta
from astraflow.consumers.trainer.mismatch import Alarm, describe
from astraflow.consumers.trainer.quarantine import PoisonBatchError, Quarantine
from astraflow.consumers.trainer.sharding import publish_weights
from astraflow.consumers.trainer.state import TrainState
from astraflow.consumers.trainer.telemetry import Telemetry
from astraflow.core.bus.types import Bus, Message
from astraflow.core.claims import BlobStore, unclaim
from astraflow.core.cores import CoreShare
from astraflow.core.errors import AstraflowError, SchemaError
from astraflow.core.fetch import RecordGoneError, fetch
from astraflow.core.metrics import MetricsEmitter, process_age
from astraflow.core.records import Batch, Group, Trajectory, decode, encode
from astraflow.core.records.checks import RecordLimits, clipped, problems
from astraflow.core.stream import TP, Input, OutRecord, Processor, Resume
from astraflow.core.topics import group_name, topic_name

log = logging.getLogger("astraflow.trainer")

StepFn = Callable[[TrainState, Batch, int], dict[str, float]]


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

    def __init__(self, *, bus: Bus, run: str, policy: str, state: TrainState, step_fn: StepFn,
                 checkpoints: CheckpointDir, publisher: Any = None,
                 checkpoint_every: int = 50, publish_every: int = 1,
                 publish_initial: bool = False, max_version: int | None = None,
                 group: str | None = None, session_timeout: float = 10.0,
                 poll_timeout: float = 0.5, dedup_window: int = 10_000,
                 on_missing_checkpoint: str = "error", log_path: str | Path | None = None,
                 metrics: MetricsEmitter | None = None, component: str = "",
                 claims: BlobStore | None = None, cores: CoreShare | None = None,
                 limits: RecordLimits | None = None, max_batch_tries: int = 2,
                 mismatch: Alarm | None = None) -> None:
        self.bus = bus
        # trainer.mismatch: a step whose fresh tokens breach it warns (or stops training)
        self.mismatch = mismatch
        self._stopped: str | None = None
        # what every trajectory of a batch is checked against before a step (the stage
        # checked it too; a batch record can be written by anyone who can produce)
        self.limits = limits or RecordLimits()
        self.quarantine = Quarantine(getattr(checkpoints, "root", None), max_batch_tries)
        self.cores = cores  # the machine's cores shared with other roles (core/cores.py)
        self.claims = claims  # where claimed (oversized) records are
        self.run_name = run
        self.policy = policy
        self.state = state
        self.step_fn = step_fn
        self.checkpoints = checkpoints
        self.publisher = publisher
        self.checkpoint_every = checkpoint_every
        self.publish_every = publish_every
        self.publish_initial = publish_initial
        self.max_version = max_version
        self.topic = topic_name(run, "batches", policy)
        self.dlq = topic_name(run, "dlq")
        self.group = group or group_name(run, "trainer", policy=policy)
        self.session_timeout = session_timeout
        self.poll_timeout = poll_timeout
        self.on_missing_checkpoint = on_missing_checkpoint
        self.component = component or f"trainer-{policy}"
        self.telemetry = Telemetry(metrics=metrics,
                                   log_path=Path(log_path) if log_path is not None else None)
        self.version = 0
        self.recent: deque[str] = deque(maxlen=dedup_window)  # ids of batches trained
        self._recent_set: set[str] = set()
        self._ckpt_offsets: dict[TP, int] = {}  # what the newest checkpoint holds
        self._checkpointed = 0  # version 0 (the model directory) needs no checkpoint
        self._published = 0  # ... and is what rollout workers start from
        self._proc: Processor | None = None
        self._channel: Any = None  # rank 0 -> other ranks (data parallelism), see dist.py
        self._ready = False
        self._resumed = False
        self._stats = TrainStats()  # of the current run()
        self._max_steps: int | None = None
        self._seen = {"dead_lettered": 0.0, "skipped_done": 0.0}  # runtime counts reported
        self._idle_since = time.monotonic()

    @property
    def metrics(self) -> MetricsEmitter | None:
        return self.telemetry.metrics

    @metrics.setter
    def metrics(self, emitter: MetricsEmitter | None) -> None:
        self.telemetry.metrics = emitter

    @property
    def offsets(self) -> dict[TP, int]:
        """The next offset to train, per partition."""
        return dict(self._proc.offsets) if self._proc is not None else dict(self._ckpt_offsets)

    # ----------------------------------------------------------------------- lifecycle

    def setup(self) -> None:
        """Load the newest checkpoint, join the consumer group and seek to its offsets.
        Ranks > 0 of a data-parallel trainer only load the checkpoint."""
        if self._ready:
            return
        self._ready = True
        if self.state.world > 1:
            from astraflow.consumers.trainer.dist import BatchChannel

            self._channel = BatchChannel(self.state.device)
        if self.state.rank > 0:
            meta = self.checkpoints.load(self.state.model, self.state.optimizer)
            self.version = meta.version if meta is not None else 0
            return
        self._proc = Processor(
            self.bus, self, [Input([self.topic], self.group, self._decode, self._handle,
                                   max_poll=1)],
            dlq=self.dlq, component=self.component, cycle_interval=None,
            cycle_when_idle=False, poll_timeout=self.poll_timeout,
            session_timeout=self.session_timeout, isolate=(PoisonBatchError,),
            commit=lambda offsets: self._commit(), claims=self.claims,
            label=f"trainer policy={self.policy} ")
        self._proc.open()
        self.telemetry.open()
        self.telemetry.log({"event": "start", "version": self.version,
                            "resumed": self._resumed, "time": time.time()})
        if not self._resumed and self.publish_initial:
            self._publish()
        log.info("trainer policy=%s version=%d resumed=%s offsets=%s", self.policy,
                 self.version, self._resumed, self._ckpt_offsets)
        age = process_age()  # from the process's start to here: imports, model, checkpoint
        if age is not None:
            self.telemetry.phase("load", age)
        self._idle_since = time.monotonic()

    def close(self) -> None:
        """Flush the publisher, leave the group, close files; rank 0 tells the other ranks
        to stop. Idempotent."""
        if self.cores is not None:
            self.cores.close()
            self.cores = None
        if self._channel is not None and self.state.rank == 0:
            self._channel.send(None)
        self._channel = None
        if self.publisher is not None:
            self.publisher.flush()
        if self._proc is not None:
            self._proc.close()
            self._proc = None
        self.telemetry.close()

    # ----------------------------------------------------------------------------- run

    def run(self, max_steps: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> TrainStats:
        """Train until ``max_steps`` more steps, ``timeout`` seconds, ``should_stop()``, or
        the configured final version (``max_version``); then checkpoint and commit."""
        self.setup()
        stats = self._stats = TrainStats(version=self.version)
        if self.state.rank > 0:
            return self._follow(stats)
        assert self._proc is not None
        self._max_steps = max_steps
        self._idle_since = time.monotonic()
        try:
            self._proc.run(timeout=timeout, should_stop=should_stop)  # ends with a checkpoint
            self._runtime_counts()
            if self.publisher is not None:
                if self.version > self._published:
                    self._publish()
                self.publisher.flush()
            self.telemetry.tick(force=True)
        finally:
            stats.version = self.version
        return stats

    def _follow(self, stats: TrainStats) -> TrainStats:
        """Ranks > 0: train every batch rank 0 hands over, and join the collectives it
        announces (fsdp: gather to publish, save a sharded checkpoint), until it says stop."""
        while True:
            kind, data = self._channel.recv_message()
            if kind == "stop":
                break
            assert data is not None
            if kind == "batch":
                self.step_fn(self.state, decode(data, Batch), self.version)
                self.version += 1
                stats.steps += 1
            elif data == b"gather":
                self.state.state_tensors()
            elif data == b"publish":
                publish_weights(self.state, self.publisher, self.version)
            elif data.startswith(b"save:"):
                self.checkpoints.save(self.state.model, self.state.optimizer,
                                      CheckpointMeta(version=int(data[5:])))
            else:
                raise TrainerError(f"rank {self.state.rank}: unknown command {data!r} from "
                                   "rank 0 (ranks of different builds?)")
        stats.version = self.version
        return stats

    def _collective(self, op: bytes) -> None:
        """Rank 0: have the other ranks join ``op`` (fsdp only: under ddp rank 0 holds the
        whole model and does these alone)."""
        if self._channel is not None and self.state.parallel == "fsdp":
            self._channel.command(op)

    # ------------------------------------------------------------- the handler

    def restore(self) -> Resume | None:
        meta = self.checkpoints.load(self.state.model, self.state.optimizer)
        if meta is None:
            committed = self.bus.committed(self.group, self.topic)
            if any(committed.values()) and self.on_missing_checkpoint == "error":
                raise TrainerError(
                    f"group {self.group} has committed offsets {committed} on {self.topic} but "
                    f"{self.checkpoints.root} holds no checkpoint: the checkpoint is the source "
                    "of truth for what was trained. Restore the checkpoint directory, start a "
                    "new run, or set trainer.on_missing_checkpoint: committed to train fresh "
                    "weights from the committed offsets")
            return None
        self._resumed = True
        self.version = self._checkpointed = self._published = meta.version
        self._ckpt_offsets = {(t, p): o for t, parts in meta.offsets.items()
                              for p, o in parts.items()}
        for bid in meta.recent:
            self._remember(bid)
        self.telemetry.counters = dict(meta.counters)
        if self.publisher is not None and hasattr(self.publisher, "resume"):
            # the checkpoint's weights are the version the dead trainer published: the next
            # version goes out as a delta against them, not as a full snapshot
            if getattr(self.publisher, "sharded", False):  # its next version is a full one
                self.publisher.resume({}, meta.version)
            else:
                self._collective(b"gather")
                self.publisher.resume(self.state.state_tensors(), meta.version)
        return Resume(dict(self._ckpt_offsets), meta.version)

    def checkpoint(self, offsets: dict[TP, int], outbox: list[OutRecord], cycle: int
                   ) -> dict[TP, int]:
        """Write a checkpoint when the version moved; otherwise the newest one stands (the
        records skipped since are skipped again after a restart)."""
        if self.version > self._checkpointed:
            started = time.monotonic()
            self._runtime_counts()
            by_topic: dict[str, dict[int, int]] = {}
            for (t, p), o in offsets.items():
                by_topic.setdefault(t, {})[p] = o
            self._collective(f"save:{self.version}".encode())
            self.checkpoints.save(self.state.model, self.state.optimizer, CheckpointMeta(
                version=self.version, offsets=by_topic, recent=list(self.recent),
                counters=dict(self.telemetry.counters)))
            self._checkpointed = self.version
            self._ckpt_offsets = dict(offsets)
            self._stats.checkpoints += 1
            self.telemetry.inc("checkpoints")
            self.telemetry.phase("checkpoint", time.monotonic() - started)
        return dict(self._ckpt_offsets)

    def delivered(self, cycle: int) -> None:
        pass

    def ready(self) -> bool:
        return True

    def done(self) -> bool:
        return (self._stopped is not None
                or (self._max_steps is not None and self._stats.steps >= self._max_steps)
                or (self.max_version is not None and self.version >= self.max_version))

    def due(self) -> bool:
        return self.version > self._checkpointed and self.version % self.checkpoint_every == 0

    def tick(self) -> list[Any]:
        self._waited()
        self._runtime_counts()
        self.telemetry.tick()
        if self.publisher is not None and hasattr(self.publisher, "maybe_refresh"):
            # starved for a while: the newest version as a full snapshot, for workers that
            # cannot build it from the deltas (Publisher.refresh_full); a publisher with its
            # background thread (the default) does it by itself and returns at once
            self.publisher.maybe_refresh()
        return []

    def _decode(self, msg: Message) -> Batch:
        batch: Batch = decode(msg.value, Batch)
        if batch.policy != self.policy:
            raise SchemaError(f"batch {batch.id!r} is for policy {batch.policy!r}, this "
                              f"trainer trains {self.policy!r}")
        if batch.id in self._recent_set:
            return batch  # a duplicate: _handle skips it, no need to fetch its records
        try:
            batch = resolve(self.bus, batch, self.claims)
        except RecordGoneError as e:  # the batch cannot be trained: dead-letter it
            raise SchemaError(f"batch {batch.id!r}: {e}") from e
        return self._trusted(batch)

    def _trusted(self, batch: Batch) -> Batch:
        """``batch`` less every trajectory :func:`problems` refuses (counted as
        ``dropped_invalid``, logged), its rewards clipped where ``beyond_bound: clip``;
        SchemaError (dead-lettered) when nothing trainable is left."""
        every = [t for g in batch.groups for t in g.trajectories]
        bad = problems(every, self.limits)  # honest batches: a few vectorised passes
        refused = {id(every[i]) for i in bad}
        for t in every:
            if id(t) not in refused:
                clipped(t, self.limits)  # in place; nothing under beyond_bound: refuse
        if not bad:
            return batch
        dropped = [f"{every[i].id}: {reason}" for i, reason in sorted(bad.items())]
        groups = []
        for g in batch.groups:
            kept = [t for t in g.trajectories if id(t) not in refused]
            if kept:
                groups.append(Group(group_id=g.group_id, task_id=g.task_id,
                                    trajectories=kept, replayed=g.replayed))
        self.telemetry.inc("dropped_invalid", len(dropped))
        log.warning("batch id=%s: dropped %d untrustworthy trajectories: %s", batch.id,
                    len(dropped), "; ".join(dropped[:3]))
        if not groups:
            raise SchemaError(f"batch {batch.id!r}: no trajectory can be trained: "
                              f"{'; '.join(dropped[:3])}")
        return Batch(id=batch.id, policy=batch.policy, seq=batch.seq, groups=groups,
                     created_at=batch.created_at)

    def _handle(self, batch: Batch, msg: Message) -> list[Any]:
        if batch.id in self._recent_set:
            self._stats.duplicates += 1
            self.telemetry.inc("duplicates")
            log.info("skipping batch id=%s already trained (origin=%s)", batch.id, msg.origin)
            return []
        if self.quarantine.is_quarantined(batch.id):  # dead-lettered before a restart
            log.info("skipping batch id=%s quarantined before (origin=%s)", batch.id,
                     msg.origin)
            return []
        self._waited()
        self._stats.busy_s += self._step(msg, batch)
        self._stats.steps += 1
        self._idle_since = time.monotonic()
        return []

    def _waited(self) -> None:
        """Time since the last step ended (or the last tick) is waiting for input."""
        now = time.monotonic()
        waited, self._idle_since = now - self._idle_since, now
        self._stats.wait_s += waited
        self.telemetry.waited(waited)

    def _runtime_counts(self) -> None:
        """Dead letters and redelivered records the runtime skipped, into the telemetry."""
        assert self._proc is not None
        for key, name in (("dead_lettered", "dead_lettered"),
                          ("skipped_done", "skipped_before_checkpoint")):
            n = self._proc.stats.get(key, 0.0) - self._seen[key]
            if n:
                self._seen[key] += n
                self.telemetry.inc(name, n)
                if key == "dead_lettered":
                    self._stats.dead_lettered += int(n)
                else:
                    self._stats.duplicates += int(n)

    def _step(self, msg: Message, batch: Batch) -> float:
        """Train, publish; returns the busy seconds (the runtime checkpoints when due)."""
        started = time.monotonic()
        if self._channel is not None:  # the resolved batch: other ranks have no bus
            self._channel.send(encode(batch))
        with self.cores.busy() if self.cores is not None else contextlib.nullcontext():
            metrics = self._train(batch)
            self.version += 1
            self._remember(batch.id)
            step_s = time.monotonic() - started
            if self.version % self.publish_every == 0:
                self._publish()
        busy = time.monotonic() - started
        self._check_mismatch(metrics)
        self.telemetry.phase("train", step_s)
        self.telemetry.phase("publish", busy - step_s)
        self.telemetry.step({
            "step": self.version, "time": time.time(), "batch_id": batch.id,
            "batch_seq": batch.seq, "origin": msg.origin, **metrics, "step_s": step_s,
            "train_tokens_per_s": metrics.get("tokens", 0.0) / max(step_s, 1e-9)}, busy)
        return busy

    def _check_mismatch(self, metrics: dict[str, float]) -> None:
        """Warn (and with ``on_breach: stop``, end training) when the step breaches
        ``trainer.mismatch``; the step's metrics get ``mismatch_alarm`` 0 or 1."""
        if self.mismatch is None:
            return
        breaches = self.mismatch.breaches(metrics)
        metrics["mismatch_alarm"] = float(bool(breaches))
        if not breaches:
            return
        line = describe(self.version, self.policy, breaches, metrics)
        log.warning("%s", line)
        self.telemetry.inc("mismatch_alarms")
        if self.mismatch.stop:
            self._stopped = line
            log.warning("trainer.mismatch.on_breach is stop: training ends after step %d",
                        self.version)
            self.telemetry.log({"event": "stop", "version": self.version,
                                "reason": "mismatch", "detail": line})

    def _train(self, batch: Batch) -> dict[str, float]:
        """The step on ``batch``, tried up to ``max_batch_tries`` times (over restarts too);
        PoisonBatchError (the runtime dead-letters the batch) when every try failed. See
        :mod:`astraflow.consumers.trainer.quarantine`."""
        q = self.quarantine
        while True:
            n = q.begin(batch.id)
            if n > q.max_tries:  # every earlier try ended its process
                q.quarantine(batch.id)
                self.telemetry.inc("quarantined")
                raise PoisonBatchError(f"batch {batch.id!r}: {n - 1} tries each ended the "
                                       "trainer's process; quarantined")
            try:
                metrics = self.step_fn(self.state, batch, self.version)
            except Exception as e:
                if self.state.world > 1:
                    raise
                self.state.optimizer.zero_grad(set_to_none=True)
                if n < q.max_tries:
                    log.warning("batch id=%s: step failed (try %d of %d), trying again: %s: %s",
                                batch.id, n, q.max_tries, type(e).__name__, e)
                    continue
                q.quarantine(batch.id)
                self.telemetry.inc("quarantined")
                raise PoisonBatchError(f"batch {batch.id!r}: the step failed {n} times; "
                                       f"quarantined: {type(e).__name__}: {e}") from e
            q.succeeded()
            return metrics

    # --------------------------------------------------------------------- effects

    def _publish(self) -> None:
        if self.publisher is None:
            return
        self._collective(b"publish")
        publish_weights(self.state, self.publisher, self.version)
        self._published = self.version
        self.telemetry.inc("published")

    def _commit(self) -> None:
        """Commit the offsets of the newest checkpoint: the bus never runs ahead of it."""
        assert self._proc is not None
        self._proc.commit(self._ckpt_offsets)

    def _remember(self, batch_id: str) -> None:
        if len(self.recent) == self.recent.maxlen:
            self._recent_set.discard(self.recent[0])
        self.recent.append(batch_id)
        self._recent_set.add(batch_id)


def resolve(bus: Bus, batch: Batch, claims: BlobStore | None = None) -> Batch:
    """``batch`` with every group's referenced trajectories fetched from the bus (claim checks
    resolved from ``claims``; copies kept as they are). Raises RecordGoneError when a
    referenced record is gone, SchemaError when one does not decode or is not the trajectory
    its reference names."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for g in batch.groups:
        for r in g.refs:
            by_topic.setdefault(r.topic, []).append((r.partition, r.offset))
    if not by_topic:
        return batch
    fetched = {topic: fetch(bus, topic, addresses) for topic, addresses in by_topic.items()}
    return assemble(batch, lambda topic, part, off: decode(
        unclaim(fetched[topic][(part, off)], claims).value, Trajectory))


def assemble(batch: Batch, trajectory: Callable[[str, int, int], Trajectory]) -> Batch:
    """``batch`` with its references replaced by ``trajectory(topic, partition, offset)`` of
    each (copies kept as they are); SchemaError when one is not the trajectory its reference
    names. :func:`resolve` reads them from the bus; a replay may read them from an index."""
    groups = []
    for g in batch.groups:
        trajs = []
        for r in g.refs:
            t = trajectory(r.topic, r.partition, r.offset)
            if t.id != r.id:
                raise SchemaError(f"batch {batch.id!r}: {r.topic}[{r.partition}]@{r.offset} "
                                  f"holds trajectory {t.id!r}, the reference names {r.id!r}")
            trajs.append(t)
        groups.append(Group(group_id=g.group_id, task_id=g.task_id, replayed=g.replayed,
                            trajectories=trajs or g.trajectories))
    return Batch(id=batch.id, policy=batch.policy, seq=batch.seq, groups=groups,
                 created_at=batch.created_at)
