"""Reading records of the embedded bus: per-partition fetch buffers and fair delivery.

Shared by the group consumer (:mod:`astraflow.core.bus.embedded_group`) and the group-less
reader (:mod:`astraflow.core.bus.embedded_reader`), so both deliver the same way.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import msgspec

from astraflow.core.bus.types import Message

FETCH_RECORDS = 500
FETCH_BYTES = 8 * 1024 * 1024
# Idle polling backoff: short, because end-to-end latency is bounded by it.
MIN_WAIT = 0.002
MAX_WAIT = 0.010

_decode_headers = msgspec.msgpack.Decoder(list[tuple[str, bytes]]).decode


@dataclass
class Partition:
    """Where one partition is read from, and the records fetched but not yet delivered."""

    position: int  # next offset to deliver
    fetched: int  # next offset to read from the database
    buffer: deque[Message] = field(default_factory=deque)

    def seek(self, offset: int) -> None:
        self.position = self.fetched = offset
        self.buffer.clear()


def fetch(conn: sqlite3.Connection, topic: str, partition: int, part: Partition) -> None:
    """Buffer the next records of ``topic[partition]`` (up to a count and a byte budget)."""
    cur = conn.execute(
        "SELECT offset, key, value, headers, ts FROM messages WHERE topic = ? AND "
        "partition = ? AND offset >= ? ORDER BY offset LIMIT ?",
        (topic, partition, part.fetched, FETCH_RECORDS))
    size = 0
    try:
        for offset, key, value, headers, ts in cur:
            part.buffer.append(Message(topic, partition, offset, key, value,
                                       _decode_headers(headers) if headers else [], ts))
            part.fetched = offset + 1
            size += len(value)
            if size >= FETCH_BYTES:
                break
    finally:
        cur.close()  # ends the read snapshot so it cannot hold back WAL checkpoints


def take(parts: Sequence[tuple[Hashable, Partition]], max_records: int,
         turn: int) -> list[Message]:
    """Up to ``max_records`` buffered records, round-robin from the partitions that have any:
    each gets an equal share in turn, starting at index ``turn`` (rotate it between calls so
    no partition is always first). Advances each partition's ``position``."""
    ready = [(key, part) for key, part in parts if part.buffer]
    if not ready:
        return []
    turn %= len(ready)
    ready = ready[turn:] + ready[:turn]
    out: list[Message] = []
    while ready and len(out) < max_records:
        share = max(1, (max_records - len(out)) // len(ready))
        remaining = []
        for key, part in ready:
            n = min(share, len(part.buffer), max_records - len(out))
            if n == 0:
                break
            out.extend(part.buffer.popleft() for _ in range(n))
            part.position = out[-1].offset + 1
            if part.buffer:
                remaining.append((key, part))
        ready = remaining
    return out
