"""The runtime's out-of-order mode: consume → (work finishes in any order) → flush → commit the
finished prefix, for a handler on an asyncio event loop whose records take as long as they
take (the rollout worker).

The handler takes records while it has ``room()``, calls :meth:`OutOfOrder.finish` once a
record's outputs are produced, and cancels the work ``on_release`` hands it after a rebalance.
To stop: :meth:`OutOfOrder.stop_committer`, then :meth:`OutOfOrder.leave`. Only contiguous
finished prefixes are committed (:mod:`astraflow.core.commits`), so a crash redelivers and
outputs must be idempotent by record id. Every bus call runs on one :class:`BusThread`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from astraflow.core.bus.types import Bus, Consumer, Message, Producer
from astraflow.core.commits import TP, OffsetTracker, commit_through
from astraflow.core.errors import CommitError
from astraflow.core.stop import Stop

log = logging.getLogger("astraflow.stream")

T = TypeVar("T")


class BusThread:
    """The one thread a component's bus calls run on, awaited from its event loop."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Coalesced(Generic[T]):
    """Hands the items that many coroutines :meth:`put` to ``fn`` on the bus thread, one call
    per batch: those put while a call runs go together in the next one (one produce call per
    batch of finished records, not one per record)."""

    def __init__(self, thread: BusThread, fn: Callable[[list[T]], None], *,
                 name: str = "coalesced") -> None:
        self.thread = thread
        self.fn = fn
        self.name = name
        self._waiting: list[tuple[list[T], asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def put(self, items: list[T]) -> None:
        """Returns once ``fn`` took ``items``; raises what it raised. Cancelled before its
        batch is taken, ``items`` are dropped (a released record is redone by its next
        owner)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((items, done))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=self.name)
        await done

    async def wait(self) -> None:
        """Until every batch put so far is handed over."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        # its own task, so that a coroutine cancelled while it waits leaves the others' items
        while self._waiting:
            batch = [(items, f) for items, f in self._waiting if not f.cancelled()]
            self._waiting = []
            try:
                await self.thread.call(self.fn, [x for items, _ in batch for x in items])
            except Exception as e:  # noqa: BLE001 - raised in each waiting coroutine
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
            else:
                for _, f in batch:
                    if not f.done():
                        f.set_result(None)


class OutOfOrder:
    """See the module docstring. ``producer``: the handler's, flushed before every commit.
    Lifecycle (on the event loop): :meth:`join`, :meth:`intake`, :meth:`stop_committer`,
    :meth:`leave`."""

    def __init__(self, bus: Bus, producer: Producer, bus_thread: BusThread, *, group: str,
                 topics: Sequence[str], client_id: str = "", session_timeout: float = 10.0,
                 poll_timeout: float = 0.1, commit_interval: float = 0.2,
                 on_release: Callable[[set[int]], None] | None = None,
                 tick: Callable[[], Awaitable[None]] | None = None, label: str = "") -> None:
        self.bus = bus
        self.producer = producer
        self.thread = bus_thread
        self.group = group
        self.topics = list(topics)
        self.client_id = client_id
        self.session_timeout = session_timeout
        self.poll_timeout = poll_timeout
        self.commit_interval = commit_interval
        self.on_release = on_release
        self.tick = tick
        self.label = label
        self.tracker = OffsetTracker()
        self.taken = 0  # records delivered to the handler
        self.commits = 0
        self.commit_errors = 0
        self.consumer: Consumer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room = asyncio.Event()
        self._finished = asyncio.Event()
        self._closing = False
        self._committer: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def join(self) -> None:
        """Join the group and start committing."""
        self._loop = asyncio.get_running_loop()
        self.consumer = await self.thread.call(
            self.bus.consumer, self.group, self.topics, client_id=self.client_id,
            session_timeout=self.session_timeout, on_revoke=self._on_revoke)
        self._committer = asyncio.create_task(self._commit_loop(), name="committer")

    async def stop_committer(self) -> None:
        """Stop the periodic commits (:meth:`leave` makes the last one)."""
        if self._committer is None:
            return
        # not cancel(): 3.11's wait_for may swallow a cancellation
        self._closing = True
        self._finished.set()
        await asyncio.gather(self._committer, return_exceptions=True)
        self._committer = None

    async def leave(self) -> None:
        """Flush and commit the finished prefix, then leave the group (partitions still
        owned are revoked: their unfinished records go to the next owner)."""
        if self.consumer is not None:
            await self.thread.call(self.commit)
            await self.thread.call(self.consumer.close)
        self._loop = None

    # -- intake ---------------------------------------------------------------------------
    def wake(self) -> None:
        """The handler has room again (event loop only)."""
        self._room.set()

    def wake_threadsafe(self) -> None:
        """:meth:`wake` from a signal handler or another thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._room.set)

    async def intake(self, stop: Stop, room: Callable[[], int],
                     accept: Callable[[Message, int], Awaitable[None]]) -> None:
        """Until ``stop`` is reached (counting records taken): read up to ``room()`` records
        (0: full, wait for :meth:`wake`), mark each delivered and ``await accept(msg,
        epoch)``; the epoch goes back with :meth:`finish`."""
        consumer = self.consumer
        assert consumer is not None
        last_probe = time.monotonic()
        while not stop.reached(self.taken):
            free = room()
            if free > 0:
                msgs = await self.thread.call(consumer.consume, stop.left(self.taken, free),
                                              stop.wait(self.poll_timeout))
                for msg in msgs:
                    epoch = self.tracker.deliver((msg.topic, msg.partition), msg.offset)
                    self.taken += 1
                    await accept(msg, epoch)
                last_probe = time.monotonic()
                continue
            if time.monotonic() - last_probe >= max(self.poll_timeout, 0.5):
                await self.thread.call(self._probe)
                last_probe = time.monotonic()
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), self.poll_timeout)

    def _probe(self) -> None:
        """Poll while full, so a rebalance can move partitions; anything read is put back."""
        assert self.consumer is not None
        for msg in self.consumer.consume(1, 0.0):
            self.consumer.seek(msg.topic, msg.partition, msg.offset)

    # -- finishing and committing --------------------------------------------------------
    def finish(self, msg: Message, epoch: int) -> bool:
        """``msg``'s outputs are produced (not necessarily flushed: the commit flushes first);
        False when its partition was revoked since delivery (the new owner redoes it)."""
        if not self.tracker.finish((msg.topic, msg.partition), msg.offset, epoch):
            return False
        self._finished.set()
        return True

    def newest_finished(self, tp: TP, epoch: int) -> int | None:
        """See :meth:`OffsetTracker.newest_finished`."""
        return self.tracker.newest_finished(tp, epoch)

    def commit(self, tps: list[TP] | None = None) -> None:
        """Flush the producer, then commit the finished prefix (bus thread only)."""
        assert self.consumer is not None
        offsets = self.tracker.committable(tps)
        if not offsets:
            return
        self.producer.flush()
        try:
            commit_through(self.consumer, offsets)
        except CommitError as e:
            self.commit_errors += 1
            log.warning("%scommit refused (the records will be redelivered): %s", self.label, e)
            return
        self.tracker.committed(offsets)
        self.commits += 1

    async def _commit_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), self.commit_interval)
            self._finished.clear()
            await self.thread.call(self.commit)
            if self.tick is not None:
                await self.tick()

    def _on_revoke(self, tps: list[TP]) -> None:
        """Partitions are leaving (bus thread, inside poll/close): commit their finished
        prefix, forget them, release their work."""
        tps = [tp for tp in tps if tp[0] in self.topics]
        if not tps:
            return
        try:
            self.commit(tps)
        finally:
            epochs = set(self.tracker.revoke(tps))
            loop = self._loop
            if epochs and self.on_release is not None and loop is not None \
                    and not loop.is_closed():
                loop.call_soon_threadsafe(self.on_release, epochs)
