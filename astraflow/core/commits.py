"""The one commit rule, for every role: a consumer group's committed offset on a partition moves
past a record only once that record's outputs, and those of every record before it on the
partition, are flushed. A crash then redelivers, never loses.

In order (:class:`~astraflow.core.stream.Processor`) the finished prefix is everything handled;
out of order (:mod:`astraflow.core.outoforder`) :class:`OffsetTracker` keeps each partition's
finished offsets and only their contiguous prefix is committed. :func:`commit_through` is the
one place a commit is written; :func:`resume_consumer` seeks a consumer to a checkpoint's
offsets."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from astraflow.core.bus.types import Bus, Consumer, Message, RebalanceCallback
from astraflow.core.errors import BusError

log = logging.getLogger("astraflow.stream")

TP = tuple[str, int]


def commit_through(consumer: Consumer, done: Mapping[TP, int], *,
                   owned_only: bool = False) -> bool:
    """Commit, per partition, every record up to and including offset ``done[tp]`` (the group
    resumes after it); ``owned_only``: skip the partitions ``consumer`` no longer owns. Returns
    False when there was nothing to commit; raises
    :class:`~astraflow.core.errors.CommitError` when the bus refuses (the records are then
    redelivered: never lost)."""
    owned = set(consumer.assignment()) if owned_only else None
    msgs = [Message(t, p, o, None, b"") for (t, p), o in done.items()
            if o >= 0 and (owned is None or (t, p) in owned)]
    if not msgs:
        return False
    consumer.commit(msgs)
    return True


def resume_consumer(bus: Bus, group: str, topics: Sequence[str],
                    offsets: Callable[[], Mapping[TP, int]], *,
                    client_id: str = "", session_timeout: float = 10.0,
                    on_revoke: RebalanceCallback | None = None, label: str = "") -> Consumer:
    """Join ``group`` and seek every partition it is assigned (at the join or at any later
    rebalance) to ``offsets()[partition]`` where one is known: for a processor whose
    checkpoint, not the group's committed offsets, says where reading resumes. Partitions
    assigned while the consumer is being constructed (the embedded bus does that) are sought
    once it exists. A seek that fails is logged; the caller must still skip records before
    its offset."""
    holder: list[Consumer] = []
    deferred: list[TP] = []

    def seek(consumer: Consumer, tp: TP) -> None:
        offset = offsets().get(tp)
        if offset is None:
            return
        try:
            consumer.seek(tp[0], tp[1], offset)
        except BusError as e:
            log.warning("%scould not seek %s[%d] to %d (%s); skipping records before it",
                        label, tp[0], tp[1], offset, e)

    def on_assign(pairs: list[TP]) -> None:
        if not holder:
            deferred.extend(pairs)
            return
        for tp in pairs:
            seek(holder[0], tp)

    consumer = bus.consumer(group, list(topics), client_id=client_id,
                            session_timeout=session_timeout, on_assign=on_assign,
                            on_revoke=on_revoke)
    holder.append(consumer)
    owned = set(consumer.assignment())
    for tp in deferred:
        if tp in owned:
            seek(consumer, tp)
    return consumer


@dataclass
class _Partition:
    epoch: int
    inflight: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    committed: int = -1  # newest offset already committed (-1: none by us)


class OffsetTracker:
    """Delivered / finished offsets per partition, for out-of-order commits; see the module
    docstring.

    Thread-safe: the event loop marks offsets; rebalance callbacks on the bus thread drop
    partitions and read what is committable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TP, _Partition] = {}
        self._epochs = 0

    def deliver(self, tp: TP, offset: int) -> int:
        """Record a delivered offset; returns the partition's epoch to hand back on finish."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                self._epochs += 1
                part = self._parts[tp] = _Partition(self._epochs)
            part.inflight.add(offset)
            return part.epoch

    def finish(self, tp: TP, offset: int, epoch: int) -> bool:
        """Mark an offset finished; False when its partition was revoked since delivery."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None or part.epoch != epoch or offset not in part.inflight:
                return False
            part.inflight.discard(offset)
            part.finished.add(offset)
            return True

    def committable(self, tps: list[TP] | None = None) -> dict[TP, int]:
        """Per partition, the newest offset whose predecessors (since delivery began) are all
        finished and that is not committed yet."""
        out: dict[TP, int] = {}
        with self._lock:
            for tp, part in self._parts.items():
                if tps is not None and tp not in tps:
                    continue
                low = min(part.inflight) if part.inflight else None
                done = [o for o in part.finished if low is None or o < low]
                if done:
                    top = max(done)
                    if top > part.committed:
                        out[tp] = top
        return out

    def committed(self, offsets: dict[TP, int]) -> None:
        """Record a successful commit (forgets finished offsets at or below it)."""
        with self._lock:
            for tp, off in offsets.items():
                part = self._parts.get(tp)
                if part is None:
                    continue
                part.committed = max(part.committed, off)
                part.finished = {o for o in part.finished if o > off}

    def newest_finished(self, tp: TP, epoch: int) -> int | None:
        """The newest finished, not yet committed offset of ``tp`` (-1: none), or None when
        the partition was revoked since ``epoch``. A finished offset's outputs are produced:
        releasing an offset before it would have the next owner produce them again."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None or part.epoch != epoch:
                return None
            return max(part.finished, default=-1)

    def revoke(self, tps: list[TP]) -> list[int]:
        """Forget partitions; returns the epochs dropped (their in-flight work is released)."""
        with self._lock:
            return [p.epoch for tp in tps if (p := self._parts.pop(tp, None)) is not None]

    def inflight(self) -> int:
        with self._lock:
            return sum(len(p.inflight) for p in self._parts.values())
