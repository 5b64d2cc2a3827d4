"""The embedded bus: partitioned, offset-addressed logs and consumer groups in one SQLite file.

The default backend (docs/reference/bus.md): no server, one WAL-mode file in the run directory
shared by every process of a run on one host. Producers buffer and append in one transaction
on :meth:`EmbeddedProducer.flush`; consumer groups (:mod:`astraflow.core.bus.embedded_group`)
follow Kafka's cooperative protocol without a coordinator. After ``flush()`` or ``commit()``
returns, the data survives the crash of any process; surviving an OS crash needs
``synchronous=full``."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import msgspec

from astraflow.core.bus.embedded_db import (
    SYNCHRONOUS,
    bump_generation,
    check_synchronous,
    connect_db,
    init_schema,
    log,
    read_tx,
    write_tx,
)
from astraflow.core.bus.embedded_group import EmbeddedConsumer
from astraflow.core.bus.embedded_reader import EmbeddedReader
from astraflow.core.bus.partitioner import partition_for
from astraflow.core.bus.reader import start_offsets
from astraflow.core.bus.types import Headers, ReaderStart, RebalanceCallback, TopicInfo
from astraflow.core.bus.url import embedded_url
from astraflow.core.errors import BusError, RecordTooLargeError, TopicError

__all__ = ["EmbeddedBus", "EmbeddedConsumer", "EmbeddedProducer", "EmbeddedReader"]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")
_MAX_TOPIC_NAME = 249  # Kafka's limit
# A producer writes its buffer once it holds this many records or bytes.
_FLUSH_RECORDS = 1000
_FLUSH_BYTES = 8 * 1024 * 1024
_BYTES = (bytes, bytearray)
_encode_headers = msgspec.msgpack.Encoder().encode


def unknown_topic(name: str) -> TopicError:
    return TopicError(f"unknown topic {name!r}; create it first with "
                      f"bus.create_topics({{{name!r}: partitions}}) or "
                      f"`astraflow topics create {name}`")


class EmbeddedBus:
    """A :class:`~astraflow.core.bus.types.Bus` on the SQLite file at ``path``.

    ``options``: ``synchronous`` (``normal`` | ``full``). The file and its parent directory are
    created on first use.
    """

    def __init__(self, path: Path, *, options: dict[str, str], max_message_bytes: int) -> None:
        unknown = sorted(set(options) - {"synchronous"})
        if unknown:
            raise BusError(f"unknown embedded bus option(s) {', '.join(unknown)}; "
                           f"valid: synchronous ({' | '.join(SYNCHRONOUS)})")
        self.synchronous = check_synchronous(options.get("synchronous", "normal"))
        self.path = Path(path).expanduser().absolute()
        self.url = embedded_url(self.path)
        self.max_message_bytes = max_message_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = connect_db(self.path, self.synchronous)
        init_schema(self._conn, self.path)
        self._clients: weakref.WeakSet[EmbeddedProducer | EmbeddedConsumer | EmbeddedReader] = (
            weakref.WeakSet())

    def __repr__(self) -> str:
        return f"EmbeddedBus({self.url!r})"

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file, for one producer, consumer or thread."""
        return connect_db(self.path, self.synchronous)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise BusError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            # A connection must not cross a fork; the child's copy is left alone, not closed.
            raise BusError(f"{self!r} was opened in process {self._pid} and used after a fork; "
                           "call connect() again in the child process")
        return self._conn

    # ----------------------------------------------------------------------------- topics

    def create_topics(self, topics: dict[str, int], *, exist_ok: bool = True) -> None:
        problems = [p for name, n in topics.items() for p in _topic_problems(name, n)]
        if problems:
            raise TopicError("; ".join(problems))

        def create(c: sqlite3.Connection) -> None:
            existing = dict(c.execute("SELECT name, partitions FROM topics"))
            for name, n in topics.items():
                if name in existing:
                    if not exist_ok:
                        raise TopicError(f"topic {name!r} already exists; pass exist_ok=True "
                                         "to accept an existing topic")
                    if existing[name] != n:
                        raise TopicError(
                            f"topic {name!r} exists with {existing[name]} partitions, asked for "
                            f"{n}; use {existing[name]}, or delete it first "
                            f"(bus.delete_topics / `astraflow topics delete {name}`)")
                    continue
                c.execute("INSERT INTO topics (name, partitions) VALUES (?, ?)", (name, n))
                c.executemany("INSERT OR REPLACE INTO log_ends VALUES (?, ?, 0)",
                              [(name, p) for p in range(n)])
            bump_generation(c)  # consumers subscribed to a new topic pick it up now

        with self._lock:
            write_tx(self._db(), create)

    def list_topics(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db().execute("SELECT name, partitions FROM topics ORDER BY name"))

    def describe_topic(self, name: str) -> TopicInfo:
        def read(c: sqlite3.Connection) -> TopicInfo:
            row = c.execute("SELECT partitions FROM topics WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise unknown_topic(name)
            ends = dict(c.execute("SELECT partition, next_offset FROM log_ends WHERE topic = ?",
                                  (name,)))
            return TopicInfo(name, row[0], {p: ends.get(p, 0) for p in range(row[0])})

        with self._lock:
            return read_tx(self._db(), read)

    def delete_topics(self, names: Sequence[str]) -> None:
        """Delete topics with their records, committed offsets and ownerships (missing names
        are ignored)."""
        def delete(c: sqlite3.Connection) -> None:
            for name in names:
                for table, column in (("topics", "name"), ("log_ends", "topic"),
                                      ("messages", "topic"), ("group_offsets", "topic"),
                                      ("group_owners", "topic")):
                    c.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))
            bump_generation(c)

        with self._lock:
            write_tx(self._db(), delete)

    # ---------------------------------------------------------------------------- clients

    def producer(self, *, client_id: str = "") -> EmbeddedProducer:
        producer = EmbeddedProducer(self, client_id=client_id)
        self._clients.add(producer)
        return producer

    def consumer(self, group: str, topics: Sequence[str], *, client_id: str = "",
                 start: str = "earliest", session_timeout: float = 10.0,
                 on_assign: RebalanceCallback | None = None,
                 on_revoke: RebalanceCallback | None = None) -> EmbeddedConsumer:
        missing = sorted(set(topics) - set(self.list_topics()))
        if missing:  # the same rule as Kafka, where auto-creation is off
            raise TopicError(f"cannot subscribe group {group!r} to missing topic(s) "
                             f"{', '.join(missing)}; create them first with bus.create_topics() "
                             "or `astraflow topics create`")
        consumer = EmbeddedConsumer(self, group, topics, client_id=client_id, start=start,
                                    session_timeout=session_timeout, on_assign=on_assign,
                                    on_revoke=on_revoke)
        self._clients.add(consumer)
        return consumer

    def reader(self, topic: str, *, start: ReaderStart = "earliest",
               client_id: str = "") -> EmbeddedReader:
        """A group-less reader of every partition of ``topic`` (see the Bus protocol); it only
        reads the file, so it leaves nothing behind."""
        info = self.describe_topic(topic)  # TopicError for an unknown topic
        positions = start_offsets(topic, start, {p: (0, end)  # no retention: 0 is the first
                                                 for p, end in info.end_offsets.items()})
        reader = EmbeddedReader(self, topic, positions, client_id=client_id)
        self._clients.add(reader)
        return reader

    # ------------------------------------------------------------------------------ groups

    def committed(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._db().execute(
                "SELECT partition, committed FROM group_offsets WHERE grp = ? AND topic = ?",
                (group, topic)))

    def lag(self, group: str, topic: str) -> dict[int, int]:
        info = self.describe_topic(topic)
        committed = self.committed(group, topic)
        return {p: end - committed.get(p, 0) for p, end in info.end_offsets.items()}

    def close(self) -> None:
        """Close every producer and consumer made by this bus, then the bus itself."""
        for client in list(self._clients):
            client.close()
        with self._lock:
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            self._conn = None


def _topic_problems(name: object, partitions: object) -> list[str]:
    problems = []
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        problems.append(f"invalid topic name {name!r}: use only letters, digits, '.', '_' "
                        "and '-' (not '.' or '..')")
    elif len(name) > _MAX_TOPIC_NAME:
        problems.append(f"topic name {name[:40]!r}... is {len(name)} characters long; "
                        f"the limit is {_MAX_TOPIC_NAME}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        problems.append(f"topic {name!r}: partitions must be an integer >= 1, got "
                        f"{partitions!r}")
    return problems


# A buffered record: (topic, partition, key, value, encoded headers or None, timestamp).
_Pending = tuple[str, int, bytes | None, bytes, bytes | None, float]


class EmbeddedProducer:
    """Buffers records and appends them to the file in one transaction per :meth:`flush`.

    Thread-safe: ``produce`` and ``flush`` may be called from several threads (they share
    one connection under a lock, never concurrently).
    """

    def __init__(self, bus: EmbeddedBus, *, client_id: str = "") -> None:
        self.client_id = client_id
        self._bus = bus
        self._conn: sqlite3.Connection | None = bus.connect()
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._topics: dict[str, int] = {}

    def _check_usable(self) -> None:
        if self._conn is None:
            raise BusError(f"producer {self.client_id!r} is closed"
                           + (f" with {len(self._pending)} records unflushed"
                              if self._pending else ""))
        if os.getpid() != self._pid:
            raise BusError(f"producer {self.client_id!r} was created in process {self._pid} "
                           "and used after a fork; create a new one in the child process")

    def _partitions(self, topic: str) -> int:
        n = self._topics.get(topic)
        if n is None:  # maybe created since we last looked, by any process
            assert self._conn is not None
            self._topics = dict(self._conn.execute("SELECT name, partitions FROM topics"))
            n = self._topics.get(topic)
            if n is None:
                raise unknown_topic(topic)
        return n

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None,
                headers: Headers | None = None, partition: int | None = None) -> None:
        """Queue a record; it is durable once :meth:`flush` returns. Raises TopicError for an
        unknown topic or partition and RecordTooLargeError at once."""
        if not isinstance(value, _BYTES) or not (key is None or isinstance(key, _BYTES)):
            raise BusError(f"record for topic {topic!r}: value and key must be bytes, got "
                           f"value={type(value).__name__} key={type(key).__name__}; encode "
                           "records first (e.g. with msgspec.msgpack)")
        encoded = None
        if headers:
            for name, val in headers:
                if not isinstance(name, str) or not isinstance(val, _BYTES):
                    raise BusError(f"header {name!r}={val!r} for topic {topic!r}: names must "
                                   "be str and values bytes")
            encoded = _encode_headers([[name, bytes(val)] for name, val in headers])
        size = len(value) + (len(key) if key is not None else 0) + len(encoded or b"")
        limit = self._bus.max_message_bytes
        if size > limit:
            raise RecordTooLargeError(
                f"record of {size} bytes for topic {topic!r} exceeds max_message_bytes="
                f"{limit}; send large payloads (e.g. weights) through the weight store and "
                "put only a manifest on the bus, or raise max_message_bytes in connect() "
                "(for Kafka also the broker's message.max.bytes)")
        with self._lock:
            self._check_usable()
            n = self._partitions(topic)
            if partition is None:
                partition = partition_for(key, n)
            elif not 0 <= partition < n:
                raise TopicError(f"partition {partition} out of range for topic {topic!r}, "
                                 f"which has {n} partitions (valid: 0..{n - 1})")
            self._pending.append((topic, partition, key, value, encoded, time.time()))
            self._pending_bytes += size
            if len(self._pending) >= _FLUSH_RECORDS or self._pending_bytes >= _FLUSH_BYTES:
                self.flush()

    def flush(self, timeout: float | None = None) -> None:
        """Append every buffered record in one transaction. On error nothing is written, the
        records stay buffered and BusError is raised. ``timeout`` is not needed: the write is
        synchronous (it waits up to the busy timeout for other writers)."""
        with self._lock:
            if not self._pending:
                return
            self._check_usable()
            assert self._conn is not None
            by_partition: dict[tuple[str, int], list[_Pending]] = defaultdict(list)
            for record in self._pending:
                by_partition[record[0], record[1]].append(record)
            try:
                missing = write_tx(self._conn, lambda c: _append(c, by_partition))
            except sqlite3.Error as exc:
                raise BusError(f"flush of {len(self._pending)} records to {self._bus.url} "
                               f"failed: {exc}") from exc
            dropped = sum(len(by_partition[tp]) for tp in missing)
            self._pending.clear()
            self._pending_bytes = 0
            if missing:
                self._topics.clear()
                names = sorted({t for t, _ in missing})
                raise TopicError(f"{dropped} records were dropped: topic(s) {', '.join(names)} "
                                 "were deleted (or shrunk) after the records were produced")

    def close(self) -> None:
        """Flush, then release the connection. Idempotent."""
        with self._lock:
            if self._conn is None:
                return
            try:
                self.flush()
            finally:
                if os.getpid() == self._pid:
                    self._conn.close()
                self._conn = None


def _append(c: sqlite3.Connection,
            by_partition: dict[tuple[str, int], list[_Pending]]) -> list[tuple[str, int]]:
    """Append records with dense offsets from each log end; return partitions that vanished."""
    missing = []
    for (topic, partition), records in by_partition.items():
        row = c.execute("SELECT next_offset FROM log_ends WHERE topic = ? AND partition = ?",
                        (topic, partition)).fetchone()
        if row is None:
            missing.append((topic, partition))
            continue
        start = row[0]
        c.executemany(
            "INSERT INTO messages (topic, partition, offset, key, value, headers, ts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(topic, partition, start + i, key, value, headers, ts)
             for i, (_, _, key, value, headers, ts) in enumerate(records)])
        c.execute("UPDATE log_ends SET next_offset = ? WHERE topic = ? AND partition = ?",
                  (start + len(records), topic, partition))
    if missing:
        log.warning("dropping records for deleted partitions %s", missing)
    return missing
