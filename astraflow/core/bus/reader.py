"""The backend-neutral half of the group-less reader (:class:`~astraflow.core.bus.types.Reader`):
where it starts, where it may seek, and reading a topic up to its end as of now.

>>> for msg in read_all(bus, "af.demo.trajectories"):    # every record there now, then stop
...     print(msg.origin)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from astraflow.core.bus.types import Bus, Message, ReaderStart
from astraflow.core.errors import BusError

STARTS = ("earliest", "latest")

#: (first offset still on the bus, end offset) of each partition.
Bounds = dict[int, tuple[int, int]]


class OffsetRangeError(BusError):
    """A reader was asked to start where the topic has no record: a partition it lacks, or an
    offset outside the first record still on the bus .. the end. Unlike other BusErrors (the
    bus unreachable or settling), asking again will not help."""


def start_offsets(topic: str, start: ReaderStart, bounds: Bounds) -> dict[int, int]:
    """The offset a reader of ``topic`` reads first in each partition, for ``start``: a name in
    :data:`STARTS` or a mapping of partition to offset (partitions it leaves out start at the
    earliest). Raises BusError naming every bad partition or offset."""
    earliest = {p: lo for p, (lo, _hi) in bounds.items()}
    if isinstance(start, str):
        if start == "earliest":
            return earliest
        if start == "latest":
            return {p: hi for p, (_lo, hi) in bounds.items()}
        raise BusError(f"invalid start={start!r} for a reader of {topic!r}; valid: "
                       f"{', '.join(STARTS)}, or a mapping of partition to offset")
    if not isinstance(start, Mapping):
        raise BusError(f"invalid start={start!r} for a reader of {topic!r}; valid: "
                       f"{', '.join(STARTS)}, or a mapping of partition to offset")
    problems = [problem for p, off in start.items()
                if (problem := offset_problem(topic, p, off, bounds))]
    if problems:
        raise OffsetRangeError("; ".join(problems))
    return {**earliest, **start}


def offset_problem(topic: str, partition: object, offset: object, bounds: Bounds) -> str | None:
    """Why a reader of ``topic`` cannot read ``partition`` from ``offset`` (None: it can)."""
    if isinstance(partition, bool) or partition not in bounds:
        return (f"{topic!r} has no partition {partition!r} (valid: 0..{len(bounds) - 1})")
    lo, hi = bounds[partition]
    if isinstance(offset, bool) or not isinstance(offset, int) or not lo <= offset <= hi:
        return (f"offset {offset!r} is outside {topic}[{partition}]'s {lo}..{hi} (the first "
                "record still on the bus .. the end, where the next record will be written)")
    return None


def read_all(bus: Bus, topic: str, *, idle_timeout: float = 30.0,
             client_id: str = "") -> Iterator[Message]:
    """Every record of ``topic`` that exists when this is called, in order within each
    partition, then stop; read by a :class:`~astraflow.core.bus.types.Reader`, so it joins no
    group. Records produced meanwhile are not included. Raises BusError when no record arrives
    for ``idle_timeout`` seconds while some are still missing."""
    ends = bus.describe_topic(topic).end_offsets
    if not any(ends.values()):
        return
    reader = bus.reader(topic, start="earliest", client_id=client_id)
    try:
        pending = {p: end for p, end in ends.items() if reader.position(p) < end}
        last = time.monotonic()
        while pending:
            msgs = reader.consume(1000, 0.5)
            now = time.monotonic()
            if msgs:
                last = now
            elif now - last > idle_timeout:
                missing = {p: (reader.position(p), end) for p, end in pending.items()}
                raise BusError(f"reading {topic!r} to its end: nothing arrived for "
                               f"{idle_timeout:g}s; partitions at (position, end): {missing}")
            for m in msgs:
                if m.offset < ends.get(m.partition, 0):
                    yield m
            pending = {p: end for p, end in pending.items() if reader.position(p) < end}
    finally:
        reader.close()
