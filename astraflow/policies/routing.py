"""Where a released task goes: the partition of ``tasks`` with the least unfinished work.

:class:`BacklogRouter` sends each task to the partition whose backlog is smallest: the rollout
group's lag on it plus the tasks routed there since that lag was read. So a slow or dead
worker's partitions get fewer tasks, unlike hash routing's equal share. The lag is read by a
background thread every ``refresh_s``, so the router never blocks; until the first read (or
while reads fail) partitions are taken in turn, and ties go to the partition after the last
one chosen. See docs/policies.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from astraflow.core.errors import BusError

log = logging.getLogger("astraflow.policies")

Lag = Callable[[], Mapping[int, int]]  # partition -> backlog, read from the bus


class BacklogRouter:
    """Picks the ``tasks`` partition with the least backlog (see the module docstring).
    :meth:`start` starts the lag reader; :meth:`close` stops it."""

    def __init__(self, lag: Lag, partitions: int, *, refresh_s: float = 1.0) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self._lag = lag
        self.partitions = partitions
        self.refresh_s = refresh_s
        self._base = [0] * partitions  # lag at the last read
        self._added = [0] * partitions  # routed since the last read
        self._last = partitions - 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0
        self.read_errors = 0

    def pick(self) -> int:
        """The partition for the next task (counted as routed there)."""
        with self._lock:
            n = self.partitions
            order = [(self._last + 1 + i) % n for i in range(n)]
            best = min(order, key=lambda p: self._base[p] + self._added[p])
            self._added[best] += 1
            self._last = best
            return best

    def backlog(self) -> list[int]:
        """Each partition's estimated backlog now."""
        with self._lock:
            return [b + a for b, a in zip(self._base, self._added, strict=True)]

    def refresh(self) -> None:
        """Read the lag once (the background thread calls this every ``refresh_s``)."""
        with self._lock:
            before = list(self._added)  # routed before this read began: in the lag it reads
        try:
            lag = dict(self._lag())
        except BusError as e:
            self.read_errors += 1
            if self.read_errors == 1:
                log.warning("task routing: reading the rollout group's lag failed (%s); "
                            "partitions are taken in turn until a read succeeds", e)
            return
        with self._lock:
            self._base = [max(0, int(lag.get(p, 0))) for p in range(self.partitions)]
            self._added = [max(0, a - b) for a, b in zip(self._added, before, strict=True)]
            self.reads += 1

    def start(self) -> BacklogRouter:
        """Read the lag once (so the first tasks already go by it), then keep reading it in
        the background."""
        if self._thread is None:
            self.refresh()
            self._thread = threading.Thread(target=self._loop, name="task-router", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None
