"""Which task offsets a worker may commit when tasks finish out of order.

A partition's committed offset may only move past a record once every record before it is
finished (its trajectories produced), so the worker commits, per partition, the contiguous
prefix of finished offsets. Revoking a partition forgets it (a new *epoch*): episodes of the old
assignment that finish later do not count, the partition's new owner redelivers them.

Thread-safe: the worker's event loop marks offsets; rebalance callbacks on the bus thread drop
partitions and read what is committable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

TP = tuple[str, int]


@dataclass
class _Partition:
    epoch: int
    inflight: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    committed: int = -1  # newest offset already committed (-1: none by us)


class OffsetTracker:
    """Delivered / finished offsets per partition; see the module docstring."""

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
        the partition was revoked since ``epoch``. A finished offset's trajectories are
        produced: releasing an offset before it would have the next owner produce them
        again."""
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
