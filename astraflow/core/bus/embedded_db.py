"""The SQLite file behind the embedded bus: schema, connections and write transactions.

Shared by :mod:`astraflow.core.bus.embedded` (bus, producer) and
:mod:`astraflow.core.bus.embedded_group` (consumer groups). Every connection is private to one
thread of one process; nothing here is shared across a fork.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from astraflow.core.errors import BusError

log = logging.getLogger("astraflow.bus.embedded")

SCHEMA_VERSION = 1
SYNCHRONOUS = ("normal", "full")
#: How long a statement waits for another process's write lock before SQLite gives up.
BUSY_TIMEOUT_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL
);
-- Next offset to write per partition: the log end, and the counter flush() advances.
CREATE TABLE IF NOT EXISTS log_ends (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
) WITHOUT ROWID;
-- A rowid table (not WITHOUT ROWID): values are often KBs, which WITHOUT ROWID handles badly.
CREATE TABLE IF NOT EXISTS messages (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    key BLOB,
    value BLOB NOT NULL,
    headers BLOB,  -- msgpack [[name, bytes], ...]; NULL when there are none
    ts REAL NOT NULL,
    PRIMARY KEY (topic, partition, offset)
);
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_members (
    grp TEXT NOT NULL,
    member_id TEXT NOT NULL,
    topics TEXT NOT NULL,  -- subscribed topic names joined by ',' (not a legal name character)
    session_timeout REAL NOT NULL,
    last_heartbeat REAL NOT NULL,  -- time.time() of the member's last heartbeat
    client_id TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (grp, member_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_owners (
    grp TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    member_id TEXT NOT NULL,
    PRIMARY KEY (grp, topic, partition)
) WITHOUT ROWID;
-- Bumped on every change members must react to (join, leave, expiry, release, topic change).
CREATE TABLE IF NOT EXISTS group_state (
    grp TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
) WITHOUT ROWID;
"""

T = TypeVar("T")


def check_synchronous(value: object) -> str:
    mode = str(value).strip().lower()
    if mode not in SYNCHRONOUS:
        raise BusError(f"invalid embedded bus option synchronous={value!r}; valid: "
                       f"{', '.join(SYNCHRONOUS)} (full also survives power loss, but is slower)")
    return mode


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def connect_db(path: Path, synchronous: str) -> sqlite3.Connection:
    """A new connection in autocommit mode; callers open transactions explicitly."""
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False, cached_statements=256)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        # Truncate the WAL back to this size after checkpoints, so a burst does not leave a
        # multi-GB -wal file behind.
        conn.execute(f"PRAGMA journal_size_limit={64 * 1024 * 1024}")
    except sqlite3.Error as exc:
        raise BusError(f"cannot open the embedded bus database {path}: {exc}") from exc
    return conn


def init_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Switch to WAL and create the tables; idempotent, and safe when processes race to it."""
    # journal_mode=WAL is persistent in the file; the switch needs an exclusive lock, which a
    # process racing us may briefly hold, so it is retried rather than failed.
    mode = retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
    if str(mode).lower() != "wal":
        raise BusError(f"the embedded bus database {path} could not switch to WAL mode "
                       f"(got {mode!r}); put it on a local filesystem, not a network share")

    def create(c: sqlite3.Connection) -> None:
        version = c.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise BusError(f"the embedded bus database {path} has schema version {version}, "
                           f"newer than this astraflow ({SCHEMA_VERSION}); upgrade astraflow")
        for statement in _statements(_SCHEMA):
            c.execute(statement)
        if version < SCHEMA_VERSION:
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    write_tx(conn, create)


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT our open transaction first, so run statements one by one.
    lines = [ln.split("--", 1)[0] for ln in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def retry_busy(fn: Callable[[], T], *, deadline_s: float = BUSY_TIMEOUT_MS / 1000) -> T:
    """Run ``fn``, retrying with a short backoff while SQLite says the database is locked.

    busy_timeout already waits for most locks; this covers the few cases where SQLite reports
    SQLITE_BUSY at once (WAL recovery, journal-mode switches).
    """
    deadline = time.monotonic() + deadline_s
    delay = 0.001
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
            log.debug("database busy, retrying in %.3fs: %s", delay, exc)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def write_tx(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction (the write lock is taken up
    front, so the transaction never fails half-way on a lock upgrade); roll back on error."""
    retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def read_tx(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(conn)`` on one consistent snapshot (a deferred read transaction)."""
    conn.execute("BEGIN")
    try:
        return fn(conn)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def bump_generation(conn: sqlite3.Connection, group: str | None = None) -> None:
    """Tell the members of ``group`` (or of every group) to re-check their assignment."""
    if group is None:
        conn.execute("UPDATE group_state SET generation = generation + 1")
        return
    conn.execute("INSERT INTO group_state (grp, generation) VALUES (?, 1) "
                 "ON CONFLICT (grp) DO UPDATE SET generation = generation + 1", (group,))
