"""The stage processor: one process running one stage's chain between its topics.

Each loop reads side inputs (trainer versions on ``weights.<policy>``; ``stats`` and
``groups.<primary>`` when a policy wants them) and then, unless a policy holds records back,
the main input; runs them through the chain; and, at most every ``commit_interval_s`` (at
once when input pauses), runs one *cycle*:

1. write the checkpoint: every policy's state, the offsets of every input record processed,
   the trainer versions and the outputs not yet produced (the outbox), atomically;
2. produce the outbox and flush (the outputs are durable);
3. commit the input offsets on the bus.

On start, the checkpoint is the source of truth: states and versions are restored, its
outbox is produced again, and each partition is read from the checkpoint's offset (the
consumer seeks there when the partition is assigned, and any record before it that is
delivered anyway is skipped). Without a checkpoint, reading starts at the group's committed
offsets with fresh states. Bus commits follow the checkpoint, so they never run ahead of it.

A stage is a singleton per run (per policy for ``batch``): its state covers every partition
of its input, so a second instance in the same consumer group would split the input without
its state.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from astraflow.core.bus.types import Bus, Consumer, Message
from astraflow.core.errors import CommitError, SchemaError
from astraflow.core.records import (
    GroupStats,
    Record,
    Task,
    Trajectory,
    TrajectoryGroup,
    WeightManifest,
    decode,
    encode,
    schema_header,
)
from astraflow.core.stream import dead_letter, resume_consumer
from astraflow.core.topics import topic_def, topic_name
from astraflow.policies import checkpoint as ckpt_io
from astraflow.policies.base import GroupRef, PolicyError
from astraflow.policies.chain import Chain
from astraflow.policies.checkpoint import Checkpoint, OutRecord

log = logging.getLogger("astraflow.policies")

FAULT_ENV = "ASTRAFLOW_POLICY_FAULT"  # "point:n": SIGKILL self the n-th time at point (tests)
KEEPALIVE_S = 60.0  # a paused main consumer still polls this often (Kafka's poll interval)
LOG_EVERY_S = 30.0
OUTBOX_BYTES = 32 * 1024 * 1024  # a cycle runs early once this much output is waiting
_group_ref = msgspec.msgpack.Decoder(GroupRef).decode

_ROUTES: dict[type, str] = {Task: "tasks", TrajectoryGroup: "groups", GroupStats: "stats"}


@dataclass(frozen=True)
class StageTopics:
    """The topics of one stage processor."""

    main: list[str]
    main_kind: type[Record]
    side: list[str]
    dlq: str
    run: str

    def route(self, record: Record) -> tuple[str, bytes | None]:
        """The topic an output record goes to, and its key (from the topic table)."""
        name = _ROUTES.get(type(record))
        if name is None:
            name = type(record).schema_name().lower()
            name = {"batch": "batches", "deadletter": "dlq", "metric": "metrics"}.get(name, name)
        d = topic_def(name)
        topic = topic_name(self.run, name, getattr(record, "policy", None) if d.per_policy
                           else None)
        key = getattr(record, d.key, None)
        return topic, key.encode() if isinstance(key, str) else key

    def side_kind(self, topic: str) -> str:
        for kind in ("weights", "stats", "groups"):
            if topic.startswith(f"af.{self.run}.{kind}"):
                return kind
        raise PolicyError(f"no side input kind for topic {topic!r}")


def stage_topics(run: str, stage: str, chain: Chain, *, policies: tuple[str, ...],
                 primary: str, policy: str | None) -> StageTopics:
    wants = chain.wants()
    side: list[str] = []
    kind: type[Record]
    if stage == "pre_rollout":
        main, kind = [topic_name(run, "tasks.raw")], Task
        side.append(topic_name(run, "weights", primary))
    elif stage == "post_rollout":
        main, kind = [topic_name(run, "trajectories")], Trajectory
        side.extend(topic_name(run, "weights", p) for p in policies)
    elif stage == "batch":
        assert policy is not None
        main, kind = [topic_name(run, "groups", policy)], TrajectoryGroup
        side.append(topic_name(run, "weights", policy))
    else:
        raise PolicyError(f"unknown stage {stage!r}; valid: pre_rollout, post_rollout, batch")
    if "stats" in wants:
        side.append(topic_name(run, "stats"))
    if "groups" in wants:
        side.append(topic_name(run, "groups", primary))
    return StageTopics(main=main, main_kind=kind, side=side, dlq=topic_name(run, "dlq"),
                       run=run)


class _Faults:
    """``ASTRAFLOW_POLICY_FAULT=after_flush:3`` kills this process with SIGKILL the third
    time it reaches ``after_flush`` in a cycle with outputs (also: after_checkpoint,
    after_commit). For crash tests."""

    def __init__(self, spec: str | None) -> None:
        self.point, self.left = "", 0
        if spec:
            point, _, n = spec.partition(":")
            self.point, self.left = point, int(n or 1)

    def hit(self, point: str, outputs: int) -> None:
        if point == self.point and outputs:
            self.left -= 1
            if self.left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)


class StageRunner:
    """Runs a :class:`Chain` between bus topics; see the module docstring."""

    def __init__(self, bus: Bus, chain: Chain, topics: StageTopics, *, stage: str,
                 policy: str | None, checkpoint: Path, group: str,
                 commit_interval_s: float = 1.0, poll_records: int = 256,
                 poll_timeout: float = 0.2, session_timeout: float = 10.0,
                 component: str = "", metrics: Any = None) -> None:
        self.bus = bus
        self.metrics = metrics  # a MetricsEmitter: counters go to the metrics topic
        self.chain = chain
        self.topics = topics
        self.stage = stage
        self.policy = policy
        self.path = checkpoint
        self.group = group
        self.commit_interval_s = commit_interval_s
        self.poll_records = poll_records
        self.poll_timeout = poll_timeout
        self.session_timeout = session_timeout
        self.component = component or f"policy-{stage}" + (f"-{policy}" if policy else "")
        self.offsets: dict[tuple[str, int], int] = {}
        self.outbox: list[OutRecord] = []
        self._outbox_bytes = 0
        self._recovered: list[OutRecord] = []
        self._cycle_no = 0
        self._dirty = False
        self._gaps: set[tuple[str, int]] = set()
        self._faults = _Faults(os.environ.get(FAULT_ENV))
        self._closing = False
        self.stats: dict[str, float] = {}
        # counters() names that are current values: reported as gauges
        self._levels = chain.levels() | {"runner.checkpoint_bytes"}

    # -------------------------------------------------------------------- counters

    def _count(self, key: str, n: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def counters(self) -> dict[str, float]:
        """The stage's counters: the runner's (``in``, ``out``, ...) and every policy's
        (``<policy>.<counter>``, checkpointed with its state)."""
        return {**{f"runner.{k}": v for k, v in sorted(self.stats.items())},
                **self.chain.counters()}

    # -------------------------------------------------------------------- recovery

    def _recover(self) -> None:
        ck = ckpt_io.load(self.path)
        if ck is None:
            log.info("stage=%s no checkpoint at %s; starting from the committed offsets",
                     self.stage, self.path)
            return
        if ck.run != self.topics.run or ck.stage != self.stage or ck.policy != self.policy:
            raise PolicyError(f"checkpoint {self.path} belongs to run={ck.run} stage={ck.stage} "
                              f"policy={ck.policy}, not run={self.topics.run} stage={self.stage}"
                              f" policy={self.policy}; point data.checkpoint_dir elsewhere")
        self.chain.restore(ck.states)
        self.chain.ctx.versions = dict(ck.versions)
        self.offsets = {(t, p): o for t, parts in ck.offsets.items() for p, o in parts.items()}
        if ckpt_io.delivered(self.path) != ck.cycle:
            self._recovered = list(ck.outbox)
        self._cycle_no = ck.cycle
        log.info("stage=%s resumed from checkpoint cycle=%d partitions=%d to_reproduce=%d",
                 self.stage, ck.cycle, len(self.offsets), len(self._recovered))

    # -------------------------------------------------------------------- consumers

    def _consumer(self, group: str, topics: list[str]) -> Consumer:
        def on_revoke(pairs: list[tuple[str, int]]) -> None:
            if self._closing:
                return
            log.warning("stage=%s group=%s lost %s: a stage processor is a singleton; if "
                        "another instance runs, stop it", self.stage, group, pairs)

        # Records before a partition's offset are skipped by _fresh where a seek fails.
        return resume_consumer(self.bus, group, topics, lambda: self.offsets,
                               client_id=self.component, session_timeout=self.session_timeout,
                               on_revoke=on_revoke, label=f"stage={self.stage} ")

    def _fresh(self, msg: Message) -> bool:
        """False for a record the state already reflects; notes the offset otherwise."""
        tp = (msg.topic, msg.partition)
        done = self.offsets.get(tp)
        if done is not None and msg.offset < done:
            self._count("skipped_done")
            return False
        if done is not None and msg.offset > done and tp not in self._gaps:
            self._gaps.add(tp)
            log.warning("stage=%s %s[%d]: records %d..%d were never processed (committed "
                        "offsets ahead of the checkpoint?)", self.stage, tp[0], tp[1], done,
                        msg.offset - 1)
        self.offsets[tp] = msg.offset + 1
        self._dirty = True
        return True

    # ------------------------------------------------------------------- processing

    def _dead(self, msg: Message, error: BaseException) -> None:
        self._count("dead_lettered")
        log.warning("stage=%s dead-lettered origin=%s key=%r error=%s", self.stage, msg.origin,
                    msg.key, error)
        self._emit([dead_letter(msg, error, group=self.group, component=self.component)])

    def _emit(self, records: list[Record]) -> None:
        limit = self.bus.max_message_bytes
        for r in records:
            topic, key = self.topics.route(r)
            value = encode(r)
            if len(value) + len(key or b"") + 64 > limit:
                self._count("too_large")
                log.error("stage=%s dropped a %s of %d bytes for %s: over the bus's "
                          "max_message_bytes=%d (raise it, or make batches/groups smaller)",
                          self.stage, type(r).__name__, len(value), topic, limit)
                continue
            self.outbox.append(OutRecord(topic, key, value, [schema_header(r)]))
            self._outbox_bytes += len(value)
            self._dirty = True

    def _main(self, msgs: list[Message]) -> int:
        n = 0
        for msg in msgs:
            if not self._fresh(msg):
                continue
            n += 1
            self._count("in")
            try:
                record = decode(msg.value, self.topics.main_kind)
            except SchemaError as e:
                self._dead(msg, e)
                continue
            try:
                outputs = self.chain.feed(record)
            except Exception as e:  # noqa: BLE001 - one bad record must not stop the stage
                self._dead(msg, e)
                continue
            self._emit(outputs)
        return n

    def _side(self, msgs: list[Message]) -> int:
        n = 0
        for msg in msgs:
            if not self._fresh(msg):
                continue
            n += 1
            self._count("side_in")
            kind = self.topics.side_kind(msg.topic)
            try:
                if kind == "weights":
                    record: Any = decode(msg.value, WeightManifest)
                elif kind == "stats":
                    record = decode(msg.value, GroupStats)
                else:
                    try:
                        record = _group_ref(msg.value)
                    except (msgspec.ValidationError, msgspec.DecodeError) as e:
                        raise SchemaError(f"invalid TrajectoryGroup: {e}") from e
                self.chain.side(record)
            except Exception as e:  # noqa: BLE001 - as for main records
                self._dead(msg, e)
        return n

    # ------------------------------------------------------------------------ cycle

    def _checkpoint(self, outbox: list[OutRecord]) -> None:
        offsets: dict[str, dict[int, int]] = {}
        for (t, p), o in self.offsets.items():
            offsets.setdefault(t, {})[p] = o
        self._cycle_no += 1
        size = ckpt_io.save(self.path, Checkpoint(
            run=self.topics.run, stage=self.stage, policy=self.policy, cycle=self._cycle_no,
            offsets=offsets, versions=dict(self.chain.ctx.versions),
            states=self.chain.snapshot(), outbox=outbox))
        self.stats["checkpoint_bytes"] = size

    def _cycle(self, producer: Any, consumers: list[Consumer]) -> None:
        outbox = self.outbox
        self._checkpoint(outbox)
        self._faults.hit("after_checkpoint", len(outbox))
        for o in outbox:
            producer.produce(o.topic, o.value, key=o.key, headers=list(o.headers))
        producer.flush()
        self._count("out", len(outbox))
        self.outbox, self._outbox_bytes, self._dirty = [], 0, False
        self._faults.hit("after_flush", len(outbox))
        if outbox:
            ckpt_io.mark_delivered(self.path, self._cycle_no)
        self._commit(consumers)
        self._count("cycles")
        self._faults.hit("after_commit", len(outbox))

    def _commit(self, consumers: list[Consumer]) -> None:
        for c in consumers:
            try:
                c.commit()
            except CommitError as e:  # the checkpoint already holds these offsets
                log.warning("stage=%s commit refused: %s", self.stage, e)

    # -------------------------------------------------------------------------- run

    def run(self, *, max_records: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """Process until ``max_records`` main records, ``timeout`` seconds or
        ``should_stop()``; then run a last cycle and return :meth:`counters`."""
        self._recover()
        producer = self.bus.producer(client_id=self.component)
        consumers: list[Consumer] = []
        ok = False
        try:
            if self._recovered:  # outputs of the last cycle before a crash: produce again
                for o in self._recovered:
                    producer.produce(o.topic, o.value, key=o.key, headers=list(o.headers))
                producer.flush()
                ckpt_io.mark_delivered(self.path, self._cycle_no)
                self._count("recovered_out", len(self._recovered))
                self._recovered = []
            main = self._consumer(self.group, self.topics.main)
            consumers.append(main)
            side = self._consumer(f"{self.group}.side", self.topics.side)
            consumers.append(side)
            self._loop(producer, main, side, max_records, timeout, should_stop)
            ok = True
        finally:
            try:
                if ok and self._dirty:
                    self._cycle(producer, consumers)
            finally:
                self._closing = True
                for c in consumers:
                    c.close()
                producer.close()
        log.info("stage=%s stopped %s", self.stage, _kv(self.counters()))
        if self.metrics is not None:
            self._report(force=True)
            self.metrics.close()
        return self.counters()

    def _loop(self, producer: Any, main: Consumer, side: Consumer, max_records: int | None,
              timeout: float | None, should_stop: Callable[[], bool] | None) -> None:
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        last_cycle = last_log = last_main = start
        done = 0
        while True:
            now = time.monotonic()
            if should_stop is not None and should_stop():
                return
            if deadline is not None and now >= deadline:
                return
            left = None if max_records is None else max_records - done
            if left is not None and left <= 0:
                return
            wait = self.poll_timeout if deadline is None else max(
                0.0, min(self.poll_timeout, deadline - now))
            self.chain.ctx.now = time.time()
            n_side = self._side(side.consume(self.poll_records, 0.0))
            n_main = 0
            if self.chain.ready():
                n = self.poll_records if left is None else min(self.poll_records, left)
                n_main = self._main(main.consume(n, 0.0 if n_side else wait))
                last_main = now
            else:
                if now - last_main >= KEEPALIVE_S:  # stay in the group; the gate queues it
                    n_main = self._main(main.consume(1, 0.0))
                    last_main = now
                if not n_side:
                    n_side = self._side(side.consume(self.poll_records, wait))
            done += n_main
            self.chain.ctx.now = time.time()
            self._emit(self.chain.tick())
            now = time.monotonic()
            idle = not n_main and not n_side
            if self._dirty and (idle or now - last_cycle >= self.commit_interval_s
                                or self._outbox_bytes >= OUTBOX_BYTES):
                self._cycle(producer, [main, side])
                last_cycle = now
            self._report()
            if now - last_log >= LOG_EVERY_S:
                log.info("stage=%s %s", self.stage, _kv(self.counters()))
                last_log = now


    def _report(self, force: bool = False) -> None:
        """Counters to the metrics topic (at the emitter's interval, or now)."""
        if self.metrics is None:
            return
        for k, v in self.counters().items():
            if k in self._levels:
                self.metrics.set(k, v)
            else:
                self.metrics.set_total(k, v)
        if force:
            self.metrics.emit()
        else:
            self.metrics.tick()


def _kv(counters: dict[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in counters.items())
