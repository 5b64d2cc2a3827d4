"""The one processor runtime: every consume → transform → produce role is a handler on it.

:class:`Processor` consumes each input, skips redeliveries, resolves claim checks, hands
records to the handler and dead-letters what cannot be decoded or handled. At each cycle the
handler checkpoints its state with the input offsets, then outputs are produced and flushed and
only then are offsets committed (:mod:`astraflow.core.commits`). A crash before the commit
redelivers inputs, so downstream effects must be idempotent by record id. Stateless handlers
use :func:`run_processor`; see docs/reference/bus.md."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from astraflow.core.bus.types import Bus, Consumer, Message, Producer, RebalanceCallback
from astraflow.core.claims import BlobStore, encode_for_bus, fits, unclaim
from astraflow.core.commits import TP, commit_through, resume_consumer
from astraflow.core.errors import CommitError, SchemaError
from astraflow.core.outputs import (
    DLQ_HEADER_BYTES,
    DLQ_TEXT_CHARS,
    DLQ_VALUE_BYTES,
    DeadLetters,
    Output,
    OutRecord,
    dead_letter,
    send,
)
from astraflow.core.records import Record, decode, schema_header
from astraflow.core.stop import FAULT_ENV, FaultPoints, Stop

__all__ = [  # the runtime's API, with what it re-exports from outputs and stop
    "DLQ_HEADER_BYTES", "DLQ_TEXT_CHARS", "DLQ_VALUE_BYTES", "FAULT_ENV", "TP", "DeadLetters",
    "FaultPoints", "Handler", "Input", "OutRecord", "Output", "Processor", "Resume",
    "Stateless", "Stop", "StreamStats", "dead_letter", "run_processor",
    "send",
]

log = logging.getLogger("astraflow.stream")

R = TypeVar("R", bound=Record)
KEEPALIVE_S = 60.0  # a paused main input is still polled this often (Kafka's poll interval)
OUTBOX_BYTES = 32 * 1024 * 1024  # a cycle runs early once this much output is waiting


# ---------------------------------------------------------------------------- the runtime

@dataclass(frozen=True)
class Input:
    """One input of a processor: ``topics`` read as consumer group ``group``; each record is
    decoded by ``decode`` (raise :class:`SchemaError` for a bad record) and handed to
    ``handle``, which returns the outputs. ``main`` inputs are read only while the handler is
    ready and count towards ``max_records``; side inputs are always read first."""

    topics: Sequence[str]
    group: str
    decode: Callable[[Message], Any]
    handle: Callable[[Any, Message], Iterable[Output]]
    main: bool = True
    max_poll: int = 256


@dataclass
class Resume:
    """What a handler's checkpoint says on start: the next offset to read per partition, the
    cycle it was written at, and its outbox when that was not known to be delivered."""

    offsets: dict[TP, int]
    cycle: int = 0
    outbox: list[OutRecord] = field(default_factory=list)


class Handler(Protocol):
    """A role on the runtime. Every method is called on the processor's thread."""

    def restore(self) -> Resume | None:
        """Load the checkpoint (state restored inside the handler); None: start fresh from
        the groups' committed offsets."""

    def checkpoint(self, offsets: dict[TP, int], outbox: list[OutRecord], cycle: int
                   ) -> Mapping[TP, int]:
        """Make the handler's state durable with ``offsets`` (and ``outbox``, in outbox
        mode); return the offsets that are now durable, which the runtime commits."""

    def delivered(self, cycle: int) -> None:
        """The outbox of checkpoint ``cycle`` is produced and flushed."""

    def ready(self) -> bool:
        """False holds the main inputs back (side inputs are still read)."""

    def done(self) -> bool:
        """True once the handler has finished its work (e.g. its final version)."""

    def due(self) -> bool:
        """True to ask for a cycle now (e.g. every N trainer steps)."""

    def tick(self) -> Iterable[Output]:
        """Called once per loop; returns outputs that time, not a record, produced. A
        handler without inputs paces itself here."""


class Stateless:
    """The handler of a processor with no state of its own: nothing to checkpoint, reading
    resumes at the groups' committed offsets. ``tick`` and ``done``, when given, are the
    handler's :meth:`Handler.tick` and :meth:`Handler.done`."""

    def __init__(self, *, tick: Callable[[], Iterable[Output]] | None = None,
                 done: Callable[[], bool] | None = None) -> None:
        self._tick = tick
        self._done = done

    def restore(self) -> Resume | None:
        return None

    def checkpoint(self, offsets: dict[TP, int], outbox: list[OutRecord], cycle: int
                   ) -> Mapping[TP, int]:
        return offsets

    def delivered(self, cycle: int) -> None:
        pass

    def ready(self) -> bool:
        return True

    def done(self) -> bool:
        return self._done is not None and self._done()

    def due(self) -> bool:
        return False

    def tick(self) -> Iterable[Output]:
        return () if self._tick is None else self._tick()


class Processor:
    """Runs a :class:`Handler` over its inputs; see the module docstring.

    ``outbox``: outputs are written into the checkpoint before they are produced (for
    handlers whose outputs depend on arrival order); otherwise they are produced at once and
    flushed before the commit. ``cycle_interval``: seconds between cycles while input flows
    (None: only when the handler is ``due`` and at the stop); ``cycle_when_idle``: a cycle as
    soon as input pauses. ``isolate``: the exceptions of ``handle`` that dead-letter the
    record; any other stops the processor without a cycle (a restart resumes at the
    checkpoint).

    Lifecycle: :meth:`open` (or the first :meth:`run`), :meth:`run` as often as wanted,
    :meth:`close`. ``commit`` replaces :meth:`commit` (tests simulate lost commits)."""

    def __init__(self, bus: Bus, handler: Handler, inputs: Sequence[Input], *, dlq: str,
                 component: str = "", outbox: bool = False,
                 cycle_interval: float | None = 0.0, cycle_when_idle: bool = True,
                 outbox_bytes: int = OUTBOX_BYTES, poll_timeout: float = 0.5,
                 session_timeout: float = 10.0,
                 isolate: tuple[type[BaseException], ...] = (Exception,),
                 faults: FaultPoints | None = None,
                 on_revoke: RebalanceCallback | None = None,
                 commit: Callable[[Mapping[TP, int]], None] | None = None,
                 claims: BlobStore | None = None, label: str = "") -> None:
        self.bus = bus
        self.handler = handler
        self.inputs = list(inputs)
        self.component = component
        self.outbox_mode = outbox
        self.cycle_interval = cycle_interval
        self.cycle_when_idle = cycle_when_idle
        self.outbox_limit = outbox_bytes
        self.poll_timeout = poll_timeout
        self.session_timeout = session_timeout
        self.isolate = isolate
        self.faults = faults or FaultPoints(os.environ.get(FAULT_ENV))
        self.label = label
        self._on_revoke = on_revoke
        self.claims = claims
        self._commit = commit or self.commit
        self.letters = DeadLetters(dlq, component=component, label=label)
        self.offsets: dict[TP, int] = {}  # next offset to process, per input partition
        self._durable: Mapping[TP, int] = {}  # what the newest checkpoint holds
        self.outbox: list[OutRecord] = []
        self.stats: dict[str, float] = {}  # in, side_in, out, dead_lettered, skipped_done, ...
        self.cycle_no = 0
        self._outbox_bytes = 0
        self._dirty = False
        self._gaps: set[TP] = set()
        self._consumers: list[tuple[Input, Consumer]] = []
        self._producer: Producer | None = None
        self._closing = False
        self._opened = False
        self._last_main = time.monotonic()

    # ------------------------------------------------------------------------ lifecycle

    def count(self, key: str, n: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def open(self) -> None:
        """Restore the handler, produce an undelivered outbox again, join every input."""
        if self._opened:
            return
        self._opened = True
        resume = self.handler.restore()
        self._producer = self.bus.producer(client_id=self.component)
        if resume is not None:
            self.offsets = dict(resume.offsets)
            self._durable = dict(resume.offsets)
            self.cycle_no = resume.cycle
            if resume.outbox:  # outputs of the last cycle before a crash: produce again
                for o in resume.outbox:
                    self._producer.produce(o.topic, o.value, key=o.key,
                                           headers=list(o.headers), partition=o.partition)
                self._producer.flush()
                self.handler.delivered(self.cycle_no)
                self.count("recovered_out", len(resume.outbox))
        for inp in self.inputs:
            self._consumers.append((inp, self._consumer(inp)))

    def _consumer(self, inp: Input) -> Consumer:
        def on_revoke(pairs: list[TP]) -> None:
            if not self._closing and self._on_revoke is not None:
                self._on_revoke(pairs)

        # Records before a partition's offset are skipped by _fresh where a seek fails.
        return resume_consumer(self.bus, inp.group, inp.topics, lambda: self.offsets,
                               client_id=self.component, session_timeout=self.session_timeout,
                               on_revoke=on_revoke, label=self.label)

    def close(self) -> None:
        """Leave every group and close the producer (no cycle: :meth:`run` ends with one)."""
        self._closing = True
        try:
            for _, c in self._consumers:
                c.close()
        finally:
            self._consumers = []
            if self._producer is not None:
                self._producer.flush()
                self._producer.close()
                self._producer = None

    def run(self, max_records: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """Process until ``max_records`` main records, ``timeout`` seconds, ``should_stop()``
        or the handler is done; then run a last cycle. Returns the runtime's counters."""
        self.open()
        self._loop(Stop(max_records, timeout, should_stop))
        # Only after a clean loop: after an error the checkpoint, not this state, is truth.
        if self._dirty:
            self.cycle()
        else:
            self._commit(self._durable)  # the bus may be behind the checkpoint we resumed from
        return dict(self.stats)

    # ------------------------------------------------------------------------ the loop

    def _loop(self, stop: Stop) -> None:
        mains = [(i, c) for i, c in self._consumers if i.main]
        sides = [(i, c) for i, c in self._consumers if not i.main]
        last_cycle = time.monotonic()
        done = 0
        while not stop.reached(done) and not self.handler.done():
            wait = stop.wait(self.poll_timeout)
            n_side = n_main = 0
            for inp, c in sides:
                n_side += self._poll(inp, c, inp.max_poll, 0.0)
            now = time.monotonic()
            if self.handler.ready():
                for inp, c in mains:
                    n_main += self._poll(inp, c, stop.left(done, inp.max_poll),
                                         0.0 if n_side else wait)
                self._last_main = now
            else:
                if now - self._last_main >= KEEPALIVE_S:  # stay in the group
                    for inp, c in mains:
                        n_main += self._poll(inp, c, 1, 0.0)
                    self._last_main = now
                if not n_side and sides:
                    for inp, c in sides:
                        n_side += self._poll(inp, c, inp.max_poll, wait)
                elif not sides:
                    time.sleep(wait)  # nothing to read while the handler holds back
            done += n_main
            self._emit(self.handler.tick())
            now = time.monotonic()
            idle = not n_main and not n_side
            if self._dirty and (
                    self.handler.due() or self._outbox_bytes >= self.outbox_limit
                    or (self.cycle_interval is not None
                        and ((idle and self.cycle_when_idle)
                             or now - last_cycle >= self.cycle_interval))):
                self.cycle()
                last_cycle = now

    def _poll(self, inp: Input, consumer: Consumer, n: int, wait: float) -> int:
        """Read up to ``n`` records of one input and handle the fresh ones; returns how many
        were handled."""
        if n <= 0:
            return 0
        handled = 0
        for msg in consumer.consume(n, wait):
            if not self._fresh(msg):
                continue
            handled += 1
            self.count("in" if inp.main else "side_in")
            try:
                record = inp.decode(unclaim(msg, self.claims))
            except SchemaError as e:
                self._dead(msg, e, inp.group)
                continue
            try:
                outputs = list(inp.handle(record, msg))
            except self.isolate as e:  # one bad record must not stop the processor
                self._dead(msg, e, inp.group)
                continue
            self._emit(outputs)
        return handled

    def _fresh(self, msg: Message) -> bool:
        """False for a record the handler's state already reflects; notes the offset
        otherwise."""
        tp = (msg.topic, msg.partition)
        done = self.offsets.get(tp)
        if done is not None and msg.offset < done:
            self.count("skipped_done")
            return False
        if done is not None and msg.offset > done and tp not in self._gaps:
            self._gaps.add(tp)
            log.warning("%s%s[%d]: records %d..%d were never processed (committed offsets "
                        "ahead of the checkpoint?)", self.label, tp[0], tp[1], done,
                        msg.offset - 1)
        self.offsets[tp] = msg.offset + 1
        self._dirty = True
        return True

    def _dead(self, msg: Message, error: BaseException, group: str) -> None:
        self.count("dead_lettered")
        self._emit([self.letters.letter(msg, error, group=group)])

    def _emit(self, outputs: Iterable[Output]) -> None:
        assert self._producer is not None
        limit = self.bus.max_message_bytes
        for out in outputs:
            self._dirty = True
            if not self.outbox_mode:
                send(self._producer, out, claims=self.claims, limit=limit)
                self.count("out")
                continue
            value, headers = encode_for_bus(out.record, limit=limit, store=self.claims,
                                            key=out.key)
            if not fits(value, out.key, limit):
                self.count("too_large")
                log.error("%sdropped a %s of %d bytes for %s: over the bus's "
                          "max_message_bytes=%d and no claim store (bus.claims) to put it in",
                          self.label, type(out.record).__name__, len(value), out.topic, limit)
                continue
            if headers[0] != schema_header(out.record):
                self.count("claimed")
            self.outbox.append(OutRecord(out.topic, out.key, value, headers, out.partition))
            self._outbox_bytes += len(value)

    # ------------------------------------------------------------------------ the cycle

    def cycle(self) -> None:
        """Checkpoint → produce the outbox → flush → commit the checkpointed offsets."""
        assert self._producer is not None
        outbox = self.outbox
        self.cycle_no += 1
        durable = self._durable = self.handler.checkpoint(dict(self.offsets), outbox,
                                                          self.cycle_no)
        self.faults.hit("after_checkpoint", len(outbox))
        for o in outbox:
            self._producer.produce(o.topic, o.value, key=o.key, headers=list(o.headers),
                                   partition=o.partition)
        self._producer.flush()
        self.count("out", len(outbox))
        self.outbox, self._outbox_bytes, self._dirty = [], 0, False
        self.faults.hit("after_flush", len(outbox))
        if outbox:
            self.handler.delivered(self.cycle_no)
        self._commit(durable)
        self.count("cycles")
        self.faults.hit("after_commit", len(outbox))

    def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` (the next offset to read) on every input's group, the
        partitions each still owns."""
        done = {tp: o - 1 for tp, o in offsets.items()}
        for _, c in self._consumers:
            try:
                commit_through(c, done, owned_only=True)
            except CommitError as e:  # the checkpoint holds the offsets; the bus catches up
                log.warning("%scommit refused: %s", self.label, e)


# ------------------------------------------------------------------ stateless processors

@dataclass
class StreamStats:
    """Counters of one :func:`run_processor` run."""

    consumed: int = 0
    produced: int = 0
    dead_lettered: int = 0
    batches: int = 0
    errors: dict[str, int] = field(default_factory=dict)


Handle = Callable[[R, Message], Iterable[Output]]


class _Typed(Generic[R]):
    def __init__(self, kind: type[R]) -> None:
        self.kind = kind

    def __call__(self, msg: Message) -> R:
        return decode(msg.value, self.kind)


def run_processor(bus: Bus, *, group: str, inputs: Sequence[str], kind: type[R],
                  handle: Handle[R], dlq: str, component: str = "",
                  max_records: int | None = None, timeout: float | None = None,
                  batch_size: int = 256, poll_timeout: float = 0.5,
                  session_timeout: float = 10.0,
                  should_stop: Callable[[], bool] | None = None) -> StreamStats:
    """A stateless processor: consume ``inputs`` as group ``group``, decode each record as
    ``kind``, transform it with ``handle``, produce its outputs, flush, then commit after
    every poll. Stops after ``max_records`` inputs, ``timeout`` seconds or ``should_stop()``."""
    proc = Processor(bus, Stateless(), [Input(inputs, group, _Typed(kind), handle,
                                              max_poll=batch_size)],
                     dlq=dlq, component=component, cycle_interval=0.0,
                     poll_timeout=poll_timeout, session_timeout=session_timeout,
                     label=f"{component} " if component else "")
    try:
        counters = proc.run(max_records, timeout, should_stop)
    finally:
        proc.close()
    return StreamStats(
        consumed=int(counters.get("in", 0) + counters.get("skipped_done", 0)),
        produced=int(counters.get("out", 0) - counters.get("dead_lettered", 0)),
        dead_lettered=int(counters.get("dead_lettered", 0)),
        batches=int(counters.get("cycles", 0)), errors=dict(proc.letters.errors))
