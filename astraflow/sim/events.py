"""The clock of every discrete-event model here: a heap of timed callbacks.

The replay simulator (:mod:`astraflow.sim.simulate`) and the elasticity model of the bench
(``bench/lib/elastic_model.py``) both run on it, so a model is a set of callbacks that
schedule one another, and two models never disagree on what "at the same time" means: events
fire in time order and, at equal times, in the order they were scheduled (first in, first
out), so a model's run is a pure function of its inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Events:
    """Timed callbacks. ``now`` is the time of the event firing (0.0 before the first)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def __len__(self) -> int:
        """Events scheduled and not fired yet."""
        return len(self._heap)

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at time ``when`` (one a rounding error before ``now`` fires
        next, at its own time)."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from ``now``."""
        self.at(self.now + delay, fn, *args)

    def run(self, stop: Callable[[], bool], settle: Callable[[], None] | None = None) -> bool:
        """Fire events until ``stop()`` is true after one (True) or none is left (False).
        ``settle``, if given, is called once after the last event of each instant (every
        event at that time, including those scheduled for it while it fired): where a model
        acts on the whole state of an instant rather than on each event."""
        while self._heap:
            self.now = self._heap[0][0]
            while self._heap and self._heap[0][0] <= self.now:
                _, _, fn, args = heapq.heappop(self._heap)
                fn(*args)
                if stop():
                    return True
            if settle is not None:
                settle()
        return False
