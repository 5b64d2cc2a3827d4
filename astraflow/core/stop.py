"""When a long-running loop stops (:class:`Stop`: by count, time or signal) and, for crash
tests, where it is killed (:class:`FaultPoints`). The runtime (:mod:`astraflow.core.stream`)
re-exports them."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

FAULT_ENV = "ASTRAFLOW_FAULT"  # "point:n": SIGKILL self the n-th time at point (crash tests)


class Stop:
    """When a long-running loop stops: after ``max_records`` units of work, after ``timeout``
    seconds, or once ``should_stop()`` is true — whichever comes first (None: never)."""

    def __init__(self, max_records: int | None = None, timeout: float | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.max_records = max_records
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.should_stop = should_stop

    def reached(self, done: int = 0) -> bool:
        if self.should_stop is not None and self.should_stop():
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        return self.max_records is not None and done >= self.max_records

    def left(self, done: int, batch: int) -> int:
        """How many records to ask for next (at most ``batch``)."""
        return batch if self.max_records is None else max(0, min(batch, self.max_records - done))

    def wait(self, poll_timeout: float) -> float:
        """How long the next poll may block: ``poll_timeout``, cut short by the deadline."""
        if self.deadline is None:
            return poll_timeout
        return max(0.0, min(poll_timeout, self.deadline - time.monotonic()))


class FaultPoints:
    """``ASTRAFLOW_FAULT=after_flush:3`` kills this process with SIGKILL the third time a
    cycle with outputs reaches ``after_flush`` (also: ``after_checkpoint``,
    ``after_commit``). For crash tests; unset, it does nothing."""

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
