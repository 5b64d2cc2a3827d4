"""Which task's episodes start next: first come, first served, at most ``limit`` episodes
started and not finished.

The worker's episode semaphore still caps how many run at once; admission keeps a task that
waits for room one waiting coroutine instead of ``n_samples`` waiting episode tasks, and
keeps a task's episodes together (a task admitted starts all of them). Event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Admission:
    """See the module docstring. ``started``: episodes admitted and not finished."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.started = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def admit(self, n: int) -> None:
        """Wait until fewer than ``limit`` episodes are started and not finished (and every
        task that asked before is admitted), then count ``n`` as started."""
        waiting = self._waiting
        while waiting and waiting[0][1].done():  # cancelled while waiting
            waiting.popleft()
        if not waiting and self.started < self.limit:
            self.started += n
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted, then cancelled before it ran
                self.started -= n
            self._wake()
            raise

    def episode_done(self, _: Any = None) -> None:
        """One admitted episode finished (a done-callback of its future)."""
        self.started -= 1
        self._wake()

    def _wake(self) -> None:
        waiting = self._waiting
        while waiting and self.started < self.limit:
            n, fut = waiting.popleft()
            if not fut.done():
                self.started += n
                fut.set_result(None)
