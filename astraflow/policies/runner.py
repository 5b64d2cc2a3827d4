"""The stage processor: one process running one stage's chain between its topics.

A handler on the processor runtime (:class:`~astraflow.core.stream.Processor`, outbox mode),
which owns offsets, dedup, dead letters, the cycle and stopping. Each loop reads side inputs,
then the main input, and runs them through the chain; every ``commit_interval_s`` a cycle
checkpoints the states, offsets and pending outputs, produces the outputs, then commits the
offsets. On start the checkpoint is the source of truth. A stage is a singleton per run (per
policy for ``batch``). Details: docs/policies.md#exactly-resume.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from astraflow.core.bus.types import Bus, Message
from astraflow.core.claims import BlobStore
from astraflow.core.errors import SchemaError
from astraflow.core.records import (
    GroupStats,
    Record,
    Task,
    Trajectory,
    TrajectoryGroup,
    WeightManifest,
    decode,
)
from astraflow.core.records.checks import RecordLimits, checked
from astraflow.core.stream import TP, FaultPoints, Input, Output, OutRecord, Processor, Resume
from astraflow.core.topics import group_name, parse_topic, route, topic_name
from astraflow.policies import checkpoint as ckpt_io
from astraflow.policies.base import GroupRef, PolicyError
from astraflow.policies.chain import Chain
from astraflow.policies.checkpoint import Checkpoint
from astraflow.policies.routing import BacklogRouter
from astraflow.policies.trust import VersionCheck

log = logging.getLogger("astraflow.policies")

FAULT_ENV = "ASTRAFLOW_POLICY_FAULT"  # "point:n": SIGKILL self the n-th time at point (tests)
LOG_EVERY_S = 30.0
_group_ref = msgspec.msgpack.Decoder(GroupRef).decode

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
        return route(self.run, record)

    def side_kind(self, topic: str) -> str:
        name = parse_topic(topic).name
        if name not in ("weights", "stats", "groups"):
            raise PolicyError(f"no side input kind for topic {topic!r}")
        return name


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


class StageRunner:
    """Runs a :class:`Chain` between bus topics: a handler on the processor runtime
    (:class:`~astraflow.core.stream.Processor`); see the module docstring."""

    def __init__(self, bus: Bus, chain: Chain, topics: StageTopics, *, stage: str,
                 policy: str | None, checkpoint: Path, group: str,
                 commit_interval_s: float = 1.0, poll_records: int = 256,
                 poll_timeout: float = 0.2, session_timeout: float = 10.0,
                 component: str = "", metrics: Any = None,
                 claims: BlobStore | None = None, router: BacklogRouter | None = None,
                 limits: RecordLimits | None = None,
                 policies: tuple[str, ...] | None = None) -> None:
        self.bus = bus
        # the door: trajectories checked against the run's facts, manifests against what the
        # trainers can have made (policies/trust.py); None: no check (pure tests of a chain)
        self.limits = limits
        self.versions = (VersionCheck(bus, topics.run, policies) if policies is not None
                         else None)
        self.router = router  # picks the partition of each Task output (None: by key)
        self.claims = claims  # where claimed (oversized) records are
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
        self.stats: dict[str, float] = {}  # the runtime's counters and checkpoint_bytes
        self._proc: Processor | None = None
        self._last_log = time.monotonic()
        # counters() names that are current values: reported as gauges
        self._levels = chain.levels() | {"runner.checkpoint_bytes"}

    # -------------------------------------------------------------------- counters

    def counters(self) -> dict[str, float]:
        """The stage's counters: the runner's (``in``, ``out``, ...) and every policy's
        (``<policy>.<counter>``, checkpointed with its state)."""
        if self._proc is not None:
            self.stats.update(self._proc.stats)
        routing = {} if self.router is None else {
            "routing.reads": float(self.router.reads),
            "routing.read_errors": float(self.router.read_errors)}
        return {**{f"runner.{k}": v for k, v in sorted(self.stats.items())}, **routing,
                **self.chain.counters()}

    # ------------------------------------------------------------- the handler

    def restore(self) -> Resume | None:
        ck = ckpt_io.load(self.path)
        if ck is None:
            log.info("stage=%s no checkpoint at %s; starting from the committed offsets",
                     self.stage, self.path)
            return None
        if ck.run != self.topics.run or ck.stage != self.stage or ck.policy != self.policy:
            raise PolicyError(f"checkpoint {self.path} belongs to run={ck.run} stage={ck.stage} "
                              f"policy={ck.policy}, not run={self.topics.run} stage={self.stage}"
                              f" policy={self.policy}; point data.checkpoint_dir elsewhere")
        self.chain.restore(ck.states)
        self.chain.ctx.versions = (dict(ck.versions) if self.versions is None
                                   else self.versions.restored(dict(ck.versions)))
        offsets = {(t, p): o for t, parts in ck.offsets.items() for p, o in parts.items()}
        outbox = list(ck.outbox) if ckpt_io.delivered(self.path) != ck.cycle else []
        log.info("stage=%s resumed from checkpoint cycle=%d partitions=%d to_reproduce=%d",
                 self.stage, ck.cycle, len(offsets), len(outbox))
        return Resume(offsets, ck.cycle, outbox)

    def checkpoint(self, offsets: dict[TP, int], outbox: list[OutRecord], cycle: int
                   ) -> dict[TP, int]:
        by_topic: dict[str, dict[int, int]] = {}
        for (t, p), o in offsets.items():
            by_topic.setdefault(t, {})[p] = o
        self.stats["checkpoint_bytes"] = ckpt_io.save(self.path, Checkpoint(
            run=self.topics.run, stage=self.stage, policy=self.policy, cycle=cycle,
            offsets=by_topic, versions=dict(self.chain.ctx.versions),
            states=self.chain.snapshot(), outbox=outbox))
        return offsets

    def delivered(self, cycle: int) -> None:
        ckpt_io.mark_delivered(self.path, cycle)

    def ready(self) -> bool:
        return self.chain.ready()

    def done(self) -> bool:
        return False

    def due(self) -> bool:
        return False

    def tick(self) -> list[Output]:
        self.chain.ctx.now = time.time()
        outputs = self._outputs(self.chain.tick())
        self._report()
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            log.info("stage=%s %s", self.stage, _kv(self.counters()))
            self._last_log = now
        return outputs

    def _main(self, record: Record, msg: Message) -> list[Output]:
        ctx = self.chain.ctx
        ctx.now, ctx.origin = time.time(), (msg.topic, msg.partition, msg.offset)
        try:
            return self._outputs(self.chain.feed(record))
        finally:
            ctx.origin = None

    def _side(self, record: Any, msg: Message) -> list[Output]:
        self.chain.ctx.now = time.time()
        self.chain.side(record)
        return []

    def _decode_main(self, msg: Message) -> Record:
        record = decode(msg.value, self.topics.main_kind)
        if not isinstance(record, Trajectory):
            return record
        if self.limits is not None:
            record = checked(record, self.limits)  # SchemaError: dead-lettered with the reason
        if self.versions is not None:
            problem = self.versions.token_problem(record)
            if problem is not None:
                raise SchemaError(f"trajectory {record.id!r}: {problem}")
        return record

    def _decode_side(self, msg: Message) -> Any:
        kind = self.topics.side_kind(msg.topic)
        if kind == "weights":
            m = decode(msg.value, WeightManifest)
            problem = None if self.versions is None else self.versions.problem(m)
            if problem is not None:
                raise SchemaError(problem)
            return m
        if kind == "stats":
            return decode(msg.value, GroupStats)
        try:
            return _group_ref(msg.value)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise SchemaError(f"invalid TrajectoryGroup: {e}") from e

    def _outputs(self, records: list[Record]) -> list[Output]:
        out = []
        for r in records:
            topic, key = self.topics.route(r)
            part = self.router.pick() if self.router is not None and isinstance(r, Task) else None
            out.append(Output(topic, r, key, part))
        return out

    def _commit(self, offsets: Mapping[TP, int]) -> None:
        assert self._proc is not None
        self._proc.commit(offsets)

    def _revoked(self, pairs: list[TP]) -> None:
        log.warning("stage=%s group=%s lost %s: a stage processor is a singleton; if another "
                    "instance runs, stop it", self.stage, self.group, pairs)

    # -------------------------------------------------------------------------- run

    def run(self, *, max_records: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """Process until ``max_records`` main records, ``timeout`` seconds or
        ``should_stop()``; then run a last cycle and return :meth:`counters`."""
        proc = self._proc = Processor(
            self.bus, self,
            [Input(self.topics.main, self.group, self._decode_main, self._main,
                   max_poll=self.poll_records),
             Input(self.topics.side, group_name(self.topics.run, "policy", stage=self.stage,
                                               policy=self.policy, side=True),
                  self._decode_side, self._side,
                   main=False, max_poll=self.poll_records)],
            dlq=self.topics.dlq, component=self.component, outbox=True,
            cycle_interval=self.commit_interval_s, poll_timeout=self.poll_timeout,
            session_timeout=self.session_timeout, faults=FaultPoints(os.environ.get(FAULT_ENV)),
            on_revoke=self._revoked, commit=self._commit, claims=self.claims,
            label=f"stage={self.stage} ")
        if self.router is not None:
            self.router.start()
        try:
            proc.run(max_records, timeout, should_stop)
        finally:
            if self.router is not None:
                self.router.close()
            proc.close()
        log.info("stage=%s stopped %s", self.stage, _kv(self.counters()))
        if self.metrics is not None:
            self._report(force=True)
            self.metrics.close()
        return self.counters()

    def _report(self, force: bool = False) -> None:
        """Counters to the metrics topic (at the emitter's interval, or now)."""
        if self.metrics is None:
            return
        for k, v in self.counters().items():
            if k in self._levels:
                self.metrics.set(k, v)
            else:  # dead letters carry one name in every role
                self.metrics.set_total("dead_lettered" if k == "runner.dead_lettered" else k, v)
        if force:
            self.metrics.emit()
        else:
            self.metrics.tick()


def _kv(counters: dict[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in counters.items())
