"""Fetching records by address: what a consumer of references does (batches carry references
to trajectory records, not copies; docs/reference/topics.md).

:func:`fetch` reads the records at given ``(partition, offset)`` addresses of one topic with a
group-less :class:`~astraflow.core.bus.types.Reader`, reading runs of nearby records
sequentially and seeking over gaps longer than ``max_gap``.

>>> msgs = fetch(bus, "af.demo.trajectories", [(3, 1200), (3, 1201), (7, 88)])
>>> msgs[(3, 1200)].value"""

from __future__ import annotations

import time
from collections.abc import Iterable

from astraflow.core.bus.reader import OffsetRangeError
from astraflow.core.bus.types import Bus, Message
from astraflow.core.errors import BusError

MAX_GAP = 64  # unwanted records read rather than seeking past them


class RecordGoneError(BusError):
    """A referenced record is no longer on the bus (retention deleted it) or never was."""


def fetch(bus: Bus, topic: str, addresses: Iterable[tuple[int, int]], *,
          max_gap: int = MAX_GAP, timeout: float = 60.0,
          client_id: str = "") -> dict[tuple[int, int], Message]:
    """The records of ``topic`` at ``addresses`` ((partition, offset) pairs), by address.
    Raises :class:`RecordGoneError` naming the addresses that are not on the bus, and
    BusError when the bus delivers nothing for ``timeout`` seconds."""
    wanted: dict[int, list[int]] = {}
    for p, o in set(addresses):
        wanted.setdefault(p, []).append(o)
    if not wanted:
        return {}
    for offs in wanted.values():
        offs.sort(reverse=True)  # pop() gives the lowest offset still wanted
    info = bus.describe_topic(topic)
    gone = [(p, o) for p, offs in wanted.items() for o in offs
            if p not in info.end_offsets or o >= info.end_offsets[p] or o < 0]
    if gone:
        raise RecordGoneError(f"{topic}: no record at {_fmt(gone)} (partition, offset); the "
                              f"partitions end at {info.end_offsets}")
    ends = info.end_offsets
    start = {p: (wanted[p][-1] if p in wanted else end) for p, end in ends.items()}
    try:
        reader = bus.reader(topic, start=start, client_id=client_id)
    except OffsetRangeError as e:  # a start before the first record still on the bus; any
        # other BusError (the broker restarting) is the bus failing, raised as it is: calling
        # it gone made the trainer dead-letter a whole batch for a moment's outage
        raise RecordGoneError(f"{topic}: some of {_fmt(_all(wanted))} are no longer on the "
                              f"bus ({e})") from e
    out: dict[tuple[int, int], Message] = {}
    last = time.monotonic()
    try:
        while wanted:
            msgs = reader.consume(1000, 0.5)
            now = time.monotonic()
            if msgs:
                last = now
            elif now - last > timeout:
                raise BusError(f"fetching {_fmt(_all(wanted))} of {topic}: nothing arrived "
                               f"for {timeout:g}s")
            for m in msgs:
                want = wanted.get(m.partition)
                if want and m.offset == want[-1]:
                    out[(m.partition, m.offset)] = m
                    want.pop()
            for p in list(wanted):
                offs = wanted[p]
                pos = reader.position(p)
                while offs and offs[-1] < pos:  # passed without being delivered
                    raise RecordGoneError(f"{topic}[{p}]@{offs[-1]} was not delivered (the "
                                          f"reader is at {pos}): no longer on the bus?")
                if not offs:
                    del wanted[p]
                    if pos < ends[p]:
                        reader.seek(p, ends[p])  # nothing more wanted here
                elif offs[-1] - pos > max_gap:
                    reader.seek(p, offs[-1])
    finally:
        reader.close()
    return out


def _all(wanted: dict[int, list[int]]) -> list[tuple[int, int]]:
    return [(p, o) for p, offs in wanted.items() for o in offs]


def _fmt(addresses: list[tuple[int, int]], n: int = 5) -> str:
    shown = ", ".join(f"[{p}]@{o}" for p, o in sorted(addresses)[:n])
    return shown + (f" and {len(addresses) - n} more" if len(addresses) > n else "")
