"""The runtime's out-of-order mode (astraflow.core.outoforder): records finish in any order, only
each partition's finished prefix is committed, after a flush; a revoked partition's finished
prefix is committed and its work released; outputs of concurrent finishers go out in batches."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from astraflow.core.bus import Bus
from astraflow.core.bus.types import Message
from astraflow.core.outoforder import BusThread, Coalesced, OutOfOrder
from astraflow.core.stop import Stop


def _fill(bus: Bus, topic: str, per_partition: dict[int, int]) -> None:
    p = bus.producer()
    for partition, n in per_partition.items():
        for i in range(n):
            p.produce(topic, f"{partition}:{i}".encode(), partition=partition)
    p.flush()
    p.close()


def _outputs(bus: Bus, topic: str) -> int:
    r = bus.reader(topic)
    try:
        return len(r.consume(100, 1.0))
    finally:
        r.close()


def test_only_the_finished_prefix_is_committed_after_a_flush(
        bus: Bus, new_topic: Callable[..., str], new_group: Callable[[], str]) -> None:
    src, out, group = new_topic(1), new_topic(1), new_group()
    _fill(bus, src, {0: 4})

    async def main() -> None:
        thread, producer = BusThread("test-bus"), bus.producer()
        stream = OutOfOrder(bus, producer, thread, group=group, topics=[src],
                            poll_timeout=0.05, commit_interval=60)
        got: list[tuple[Message, int]] = []

        async def accept(msg: Message, epoch: int) -> None:
            got.append((msg, epoch))

        await stream.join()
        await stream.intake(Stop(4, timeout=30), lambda: 4, accept)
        assert [m.offset for m, _ in got] == [0, 1, 2, 3]
        for msg, epoch in reversed(got[1:]):  # 3, 2, 1 finish; 0 still runs
            await thread.call(producer.produce, out, msg.value)
            assert stream.finish(msg, epoch)
        await thread.call(stream.commit)
        assert bus.committed(group, src) == {}  # record 0 is not done: nothing moves
        msg, epoch = got[0]
        await thread.call(producer.produce, out, msg.value)
        assert stream.finish(msg, epoch)
        await thread.call(stream.commit)
        assert bus.committed(group, src) == {0: 4}
        assert _outputs(bus, out) == 4  # flushed before the commit
        assert stream.commits == 1 and stream.commit_errors == 0
        await stream.stop_committer()
        await stream.leave()
        await thread.call(producer.close)
        thread.close()

    asyncio.run(main())


def test_a_revoked_partition_commits_its_prefix_and_releases_its_work(
        bus: Bus, new_topic: Callable[..., str], new_group: Callable[[], str]) -> None:
    src, group = new_topic(2), new_group()
    _fill(bus, src, {0: 2, 1: 2})

    async def main() -> None:
        thread, producer = BusThread("test-bus"), bus.producer()
        released: list[set[int]] = []
        stream = OutOfOrder(bus, producer, thread, group=group, topics=[src],
                            poll_timeout=0.05, commit_interval=60, session_timeout=30.0,
                            on_release=released.append)
        got: list[tuple[Message, int]] = []

        async def accept(msg: Message, epoch: int) -> None:
            got.append((msg, epoch))

        await stream.join()
        await stream.intake(Stop(4, timeout=30), lambda: 4, accept)
        first = {m.partition: (m, e) for m, e in reversed(got)}  # offset 0 of each
        for msg, epoch in first.values():  # offset 1 of each is still in flight
            # marked without waking the committer: only the revoke commits
            assert stream.tracker.finish((msg.topic, msg.partition), msg.offset, epoch)
        assert bus.committed(group, src) == {}
        # long sessions: nobody dies here, and a member a loaded host kept from heartbeating
        # for a few seconds would be evicted (both partitions lost, not one revoked)
        other = await asyncio.to_thread(bus.consumer, group, [src], session_timeout=30.0)
        lost: set[tuple[str, int]] = set()

        async def newcomer() -> None:  # its side of the rebalance (Kafka: some polls)
            nonlocal lost
            for _ in range(240):  # a hang guard: 2 minutes of polls on a loaded machine
                await asyncio.to_thread(other.consume, 10, 0.5)
                if lost := set(other.assignment()):
                    return

        try:  # the newcomer takes a partition; the full worker still polls (and lets go);
            # both poll at once, so neither waits for the other's turn on a busy machine
            # the full worker polls until the newcomer holds its partition: a cooperative
            # rebalance takes two rounds (revoke, then assign), and the second completes only
            # once every member has polled again (a worker never stops polling; the test's
            # intake stopped at the revoke once, and the newcomer got nothing in 2 minutes)
            await asyncio.gather(
                stream.intake(Stop(timeout=150, should_stop=lambda: bool(released and lost)),
                              lambda: 0, accept),
                newcomer())
            state = (released, lost, stream.commits, stream.commit_errors)
            assert len(released) == 1, state
            assert len(lost) == 1, state
            (_, part), = lost
            committed = bus.committed(group, src)
            assert committed.get(part) == 1, (committed, state)  # its finished prefix: 0
            msg, epoch = next((m, e) for m, e in got if m.partition == part and m.offset == 1)
            assert released[0] == {epoch}
            assert not stream.finish(msg, epoch)  # finished too late: the new owner redoes it
        finally:
            # both consumers closed however the test ends: one left to the garbage collector
            # is destroyed inside a later test, where librdkafka's close can block for good
            await asyncio.to_thread(other.close)
            await stream.stop_committer()
            await stream.leave()
            await thread.call(producer.close)
            thread.close()

    asyncio.run(main())


def test_coalesced_batches_what_is_put_while_a_call_runs() -> None:
    calls: list[list[str]] = []
    gate = threading.Event()

    def fn(items: list[str]) -> None:
        calls.append(items)
        if len(calls) == 1:
            gate.wait(10)
        if "bad" in items:
            raise ValueError("refused")

    async def main() -> None:
        thread = BusThread("test-bus")
        c: Coalesced[str] = Coalesced(thread, fn)
        first = asyncio.create_task(c.put(["a"]))
        await asyncio.sleep(0.05)  # the first call runs (blocked) on the bus thread
        second = asyncio.create_task(c.put(["b"]))
        dropped = asyncio.create_task(c.put(["x"]))
        third = asyncio.create_task(c.put(["c", "bad"]))
        await asyncio.sleep(0.05)
        dropped.cancel()
        gate.set()
        await first
        with pytest.raises(ValueError, match="refused"):
            await second  # its batch-mate's error reaches each waiter
        with pytest.raises(ValueError, match="refused"):
            await third
        await c.wait()
        thread.close()

    asyncio.run(main())
    assert calls == [["a"], ["b", "c", "bad"]]
