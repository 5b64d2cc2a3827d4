"""The embedded bus's group-less reader: every partition of one topic, read-only.

It only ever reads the file (no group, member, ownership or offset row is written), so any
number of readers follow a topic without affecting each other or any consumer group.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from astraflow.core.bus.embedded_fetch import MAX_WAIT, MIN_WAIT, Partition, fetch, take
from astraflow.core.bus.reader import offset_problem
from astraflow.core.bus.types import Message
from astraflow.core.errors import BusError

if TYPE_CHECKING:
    from astraflow.core.bus.embedded import EmbeddedBus

log = logging.getLogger("astraflow.bus.embedded")

# While records are buffered, the database is looked at no more often than this.
_RECHECK_BUSY = 0.005
# Log ends are re-read at least this often even when PRAGMA data_version says nothing changed.
_RECHECK_IDLE = 1.0


class EmbeddedReader:
    """A :class:`~astraflow.core.bus.types.Reader` of ``topic`` on the embedded bus, starting
    at ``positions`` (one offset per partition, already checked by the bus)."""

    def __init__(self, bus: EmbeddedBus, topic: str, positions: dict[int, int], *,
                 client_id: str = "") -> None:
        self.topic = topic
        self.partitions = len(positions)
        self.client_id = client_id
        self._bus = bus
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = bus.connect()
        self._parts = {p: Partition(off, off) for p, off in sorted(positions.items())}
        self._ends: dict[int, int] = {}
        self._data_version = -1
        self._next_check = 0.0
        self._last_tick = 0.0
        self._turn = 0
        log.debug("reader=%s topic=%s from %s", client_id, topic, positions)

    def __repr__(self) -> str:
        return f"EmbeddedReader(topic={self.topic!r}, client_id={self.client_id!r})"

    def poll(self, timeout: float = 1.0) -> Message | None:
        records = self.consume(1, timeout)
        return records[0] if records else None

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Up to ``max_records`` records, round-robin across partitions; returns as soon as
        any is available, or [] after ``timeout`` seconds."""
        if max_records < 1:
            raise BusError(f"max_records must be >= 1, got {max_records}")
        with self._lock:
            deadline = time.monotonic() + max(timeout, 0.0)
            delay = MIN_WAIT
            while True:
                self._tick()
                self._turn += 1
                records = take(list(self._parts.items()), max_records, self._turn)
                if records:
                    return records
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(delay, left))
                delay = min(delay * 2, MAX_WAIT)

    def position(self, partition: int) -> int:
        with self._lock:
            return self._part(partition).position

    def seek(self, partition: int, offset: int) -> None:
        with self._lock:
            part = self._part(partition)
            end = self._db().execute(
                "SELECT next_offset FROM log_ends WHERE topic = ? AND partition = ?",
                (self.topic, partition)).fetchone()
            problem = offset_problem(self.topic, partition, offset,
                                     {partition: (0, end[0] if end else 0)})
            if problem:
                raise BusError(f"cannot seek: {problem}")
            part.seek(offset)

    def close(self) -> None:
        """Release the connection. Idempotent; nothing on the bus changes."""
        with self._lock:
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            self._conn = None

    def _part(self, partition: int) -> Partition:
        part = self._parts.get(partition)
        if part is None:
            raise BusError(f"{self.topic!r} has no partition {partition!r} (valid: "
                           f"0..{self.partitions - 1})")
        return part

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise BusError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            raise BusError(f"{self!r} was created in process {self._pid} and used after a "
                           "fork; create a new reader in the child process")
        return self._conn

    def _tick(self) -> None:
        """Notice new records (one PRAGMA read when nothing changed) and fetch them."""
        conn = self._db()
        now = time.monotonic()
        buffered = any(part.buffer for part in self._parts.values())
        if buffered and now - self._last_tick < _RECHECK_BUSY:
            return
        self._last_tick = now
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version or now >= self._next_check:
            self._data_version = version
            self._next_check = now + _RECHECK_IDLE
            self._ends = dict(conn.execute(
                "SELECT partition, next_offset FROM log_ends WHERE topic = ?", (self.topic,)))
        for p, part in self._parts.items():
            if not part.buffer and part.fetched < self._ends.get(p, 0):
                fetch(conn, self.topic, p, part)
