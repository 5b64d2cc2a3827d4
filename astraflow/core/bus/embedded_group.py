"""Consumer groups of the embedded bus: membership, heartbeats, rebalancing, fetch and commit.

Kafka's cooperative rebalancing without a coordinator: members register in ``group_members``
and heartbeat from a thread, which also removes silent members. On a generation change every
member computes the same target with :func:`assign` (a pure function of the sorted members and
partitions), releases what it owns outside it (``on_revoke`` first) and claims unowned target
partitions (then ``on_assign``), so no partition ever has two owners."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from astraflow.core.bus.embedded_db import bump_generation, read_tx, write_tx
from astraflow.core.bus.embedded_fetch import MAX_WAIT, MIN_WAIT, Partition, fetch, take
from astraflow.core.bus.types import Message, RebalanceCallback
from astraflow.core.errors import BusError, CommitError

if TYPE_CHECKING:
    from astraflow.core.bus.embedded import EmbeddedBus

log = logging.getLogger("astraflow.bus.embedded")

TP = tuple[str, int]
_STARTS = ("earliest", "latest")
# While records are buffered, the database is looked at no more often than this.
_RECHECK_BUSY = 0.005


def assign(members: Sequence[str], topic: str, partitions: int) -> dict[str, list[int]]:
    """The partitions of ``topic`` each member should own: deterministic, balanced (counts
    differ by at most one) and mostly sticky (rendezvous hashing: a member joining or leaving
    moves few partitions)."""
    return {m: list(ps) for m, ps in _assign(tuple(sorted(members)), topic, partitions).items()}


@functools.lru_cache(maxsize=256)
def _assign(members: tuple[str, ...], topic: str, partitions: int) -> dict[str, tuple[int, ...]]:
    if not members:
        return {}
    base, extra = divmod(partitions, len(members))

    def score(member: str, p: int) -> bytes:
        return hashlib.blake2b(f"{member}\0{topic}\0{p}".encode(), digest_size=8).digest()

    # Best (member, partition) affinities first; each member takes up to its fair share.
    pairs = sorted(((score(m, p), m, p) for m in members for p in range(partitions)),
                   reverse=True)
    owner: dict[int, str] = {}
    count = dict.fromkeys(members, 0)
    above_base = 0
    for _, m, p in pairs:
        if p in owner:
            continue
        if count[m] < base or (count[m] == base and above_base < extra):
            above_base += count[m] == base
            owner[p] = m
            count[m] += 1
            if len(owner) == partitions:
                break
    return {m: tuple(sorted(p for p, o in owner.items() if o == m)) for m in members}


@dataclass
class _View:
    """One consistent snapshot of a group."""

    generation: int
    members: dict[str, frozenset[str]]  # member id -> subscribed topics
    partitions: dict[str, int]  # subscribed topic -> partition count
    owners: dict[TP, str]


class EmbeddedConsumer:
    """A member of consumer group ``group`` on ``topics``; see the module docstring.

    Not meant for concurrent use from several threads (like Kafka's consumers), though calls
    from different threads are serialised safely (e.g. ``close()`` from a signal handler's
    thread). Rebalance callbacks run inside ``poll``/``consume``/``close`` on the caller's
    thread; ``on_revoke`` may still ``commit()`` the partitions it is given.
    """

    def __init__(self, bus: EmbeddedBus, group: str, topics: Sequence[str], *,
                 client_id: str = "", start: str = "earliest", session_timeout: float = 10.0,
                 on_assign: RebalanceCallback | None = None,
                 on_revoke: RebalanceCallback | None = None) -> None:
        if start not in _STARTS:
            raise BusError(f"invalid start={start!r}; valid: {', '.join(_STARTS)}")
        if not group or not topics or isinstance(topics, str):
            raise BusError(f"a consumer needs a group and a list of topics; got group={group!r}"
                           f" topics={topics!r}")
        if session_timeout <= 0:
            raise BusError(f"session_timeout must be > 0 seconds, got {session_timeout!r}")
        self.group = group
        self.client_id = client_id
        self.member_id = f"{client_id or 'consumer'}-{uuid.uuid4().hex[:12]}"
        self.topics = tuple(sorted(set(topics)))
        self._bus = bus
        self._start = start
        self._session_timeout = session_timeout
        self._interval = max(session_timeout / 4, 0.05)
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = bus.connect()
        self._owned: dict[TP, Partition] = {}
        self._delivered: dict[TP, int] = {}  # offset after the newest delivered record
        self._last_commit: dict[TP, int] = {}
        # Partitions dropped with delivered, uncommitted records (named by commit(None)).
        self._lost: set[TP] = set()
        self._ends: dict[TP, int] = {}
        self._data_version = -1
        self._generation = -1
        self._next_check = 0.0
        self._last_tick = 0.0
        self._rr = 0
        self._expired = threading.Event()
        self._stop = threading.Event()
        marks = ",".join("?" * len(self.topics))
        self._ends_sql = ("SELECT topic, partition, next_offset FROM log_ends "
                          f"WHERE topic IN ({marks})")

        write_tx(self._conn, self._register)
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                           name=f"astraflow-heartbeat-{self.member_id}")
        self._heartbeat.start()
        log.info("group=%s member=%s joined topics=%s", group, self.member_id, self.topics)
        with self._lock:
            self._tick()

    def __repr__(self) -> str:
        return f"EmbeddedConsumer(group={self.group!r}, member_id={self.member_id!r})"

    # ---------------------------------------------------------------------------- public

    def poll(self, timeout: float = 1.0) -> Message | None:
        """The next record of an owned partition, or None after ``timeout`` seconds."""
        records = self.consume(1, timeout)
        return records[0] if records else None

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Up to ``max_records`` records, round-robin across owned partitions; returns as
        soon as any is available, or [] after ``timeout`` seconds."""
        if max_records < 1:
            raise BusError(f"max_records must be >= 1, got {max_records}")
        with self._lock:
            deadline = time.monotonic() + max(timeout, 0.0)
            delay = MIN_WAIT
            while True:
                self._tick()
                records = self._take(max_records)
                if records:
                    return records
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(delay, left))
                delay = min(delay * 2, MAX_WAIT)

    def commit(self, messages: Message | Sequence[Message] | None = None) -> None:
        """Commit synchronously, per partition the offset after the newest given (or, with
        None, delivered) record. Committed offsets never move backwards. Partitions this
        member still owns are committed; CommitError names the ones it no longer owns (with
        None: those dropped with uncommitted deliveries that have not come back)."""
        lost: set[TP] = set()
        with self._lock:
            conn = self._db()
            if messages is None:
                offsets = dict(self._delivered)
                lost, self._lost = self._lost, set()
            else:
                offsets = {}
                for m in [messages] if isinstance(messages, Message) else messages:
                    tp = (m.topic, m.partition)
                    offsets[tp] = max(offsets.get(tp, 0), m.offset + 1)
            offsets = {tp: o for tp, o in offsets.items() if self._last_commit.get(tp) != o}
            refused: list[TP] = []
            if offsets:
                refused = write_tx(conn, lambda c: self._write_offsets(c, offsets))
                self._last_commit.update((tp, o) for tp, o in offsets.items()
                                         if tp not in refused)
            self._lost -= set(refused)  # named now: not again by the next commit(None)
        if refused or lost:
            names = ", ".join(f"{t}[{p}]" for t, p in sorted(set(refused) | lost))
            raise CommitError(f"group {self.group!r} member {self.member_id}: cannot commit "
                              f"{names}: partition reassigned to another member after a "
                              "rebalance or an expired session; the records will be delivered "
                              "again")

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member owns now."""
        with self._lock:
            return sorted(self._owned)

    def position(self, topic: str, partition: int) -> int | None:
        with self._lock:
            part = self._owned.get((topic, partition))
            return part.position if part else None

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Deliver ``topic[partition]`` from ``offset`` next (an owned partition only)."""
        with self._lock:
            part = self._owned.get((topic, partition))
            if part is None:
                raise BusError(f"cannot seek {topic}[{partition}]: not assigned to member "
                               f"{self.member_id}; assigned: {sorted(self._owned)}")
            if offset < 0:
                raise BusError(f"cannot seek {topic}[{partition}] to negative offset {offset}")
            part.seek(offset)

    def close(self) -> None:
        """Leave the group: ``on_revoke`` for what it owns, ownerships and membership deleted
        (the partitions move to the others at once), connections closed. Idempotent."""
        with self._lock:
            if self._conn is None:
                return
            self._stop.set()
            self._heartbeat.join(timeout=5.0)
            owned = sorted(self._owned)
            try:
                if owned:
                    self._callback(self._on_revoke, owned)
            finally:
                try:
                    if os.getpid() == self._pid:
                        write_tx(self._conn, self._leave)
                        self._conn.close()
                except sqlite3.Error as exc:
                    log.warning("group=%s member=%s could not leave cleanly (%s); it expires "
                                "after its session timeout", self.group, self.member_id, exc)
                self._owned.clear()
                self._conn = None
                log.info("group=%s member=%s left", self.group, self.member_id)

    # --------------------------------------------------------------------------- delivery

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise BusError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            raise BusError(f"{self!r} was created in process {self._pid} and used after a "
                           "fork; create a new consumer in the child process")
        return self._conn

    def _tick(self) -> None:
        """Notice group changes and new records; one PRAGMA read when nothing changed."""
        conn = self._db()
        if self._expired.is_set():
            self._rejoin()
        now = time.monotonic()
        buffered = any(part.buffer for part in self._owned.values())
        if buffered and now - self._last_tick < _RECHECK_BUSY and now < self._next_check:
            return
        self._last_tick = now
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._data_version = version
            row = conn.execute("SELECT generation FROM group_state WHERE grp = ?",
                               (self.group,)).fetchone()
            if (row[0] if row else 0) != self._generation:
                self._rebalance()
            self._refresh_ends()
        elif now >= self._next_check:
            self._rebalance()
        for tp, part in self._owned.items():
            if not part.buffer and part.fetched < self._ends.get(tp, 0):
                fetch(conn, tp[0], tp[1], part)

    def _refresh_ends(self) -> None:
        rows = self._db().execute(self._ends_sql, self.topics)
        self._ends = {(t, p): end for t, p, end in rows}

    def _take(self, max_records: int) -> list[Message]:
        self._rr += 1
        out = take(list(self._owned.items()), max_records, self._rr)
        for m in out:
            self._delivered[m.topic, m.partition] = m.offset + 1
        return out

    # -------------------------------------------------------------------------- rebalance

    def _rebalance(self) -> None:
        self._next_check = time.monotonic() + self._interval
        view = read_tx(self._db(), self._read_view)
        self._converge(view)
        # Only once converged: if a callback raised, the next tick tries again.
        self._generation = view.generation

    def _converge(self, view: _View) -> None:
        """Release what we own outside our target, then claim the free part of it."""
        conn = self._db()
        if self.member_id not in view.members:
            self._expired.set()  # handled by _rejoin at the next tick
            return
        target: set[TP] = set()
        for topic, n in view.partitions.items():
            members = [m for m, topics in view.members.items() if topic in topics]
            target.update((topic, p) for p in _assign(tuple(sorted(members)), topic, n)
                          .get(self.member_id, ()))
        mine = {tp for tp, owner in view.owners.items() if owner == self.member_id}
        lost = sorted(set(self._owned) - mine)
        if lost:  # someone removed our rows: we were expired and others took over
            self._drop(lost)
            self._callback(self._on_revoke, lost)
        release = sorted(mine - target)
        if release:
            try:
                self._callback(self._on_revoke, [tp for tp in release if tp in self._owned])
            finally:
                write_tx(conn, lambda c: self._write_release(c, release))
                self._drop(release)
        # Free: no owner, an owner that left the group, or a row of ours we do not track.
        claim = sorted(tp for tp in target - set(self._owned)
                       if (owner := view.owners.get(tp)) == self.member_id
                       or owner not in view.members)
        if not claim:
            return
        claimed = write_tx(conn, lambda c: self._write_claim(c, claim))
        if claimed is None:
            self._expired.set()
            return
        for tp, position in claimed:
            self._owned[tp] = Partition(position, position)
            self._lost.discard(tp)  # back: its records come again from the committed offset
        self._refresh_ends()
        if claimed:
            log.info("group=%s member=%s assigned %s", self.group, self.member_id,
                     [f"{t}[{p}]" for (t, p), _ in claimed])
            self._callback(self._on_assign, [tp for tp, _ in claimed])

    def _read_view(self, c: sqlite3.Connection) -> _View:
        row = c.execute("SELECT generation FROM group_state WHERE grp = ?",
                        (self.group,)).fetchone()
        members = {m: frozenset(topics.split(",")) for m, topics in c.execute(
            "SELECT member_id, topics FROM group_members WHERE grp = ?", (self.group,))}
        partitions = {name: n for name, n in c.execute(
            f"SELECT name, partitions FROM topics WHERE name IN "
            f"({','.join('?' * len(self.topics))})", self.topics)}
        owners = {(t, p): m for t, p, m in c.execute(
            "SELECT topic, partition, member_id FROM group_owners WHERE grp = ?", (self.group,))}
        return _View(row[0] if row else 0, members, partitions, owners)

    def _drop(self, tps: Sequence[TP]) -> None:
        for tp in tps:
            if self._delivered.get(tp, 0) > self._last_commit.get(tp, 0):
                self._lost.add(tp)
            self._owned.pop(tp, None)
            self._delivered.pop(tp, None)
            self._last_commit.pop(tp, None)
        if tps:
            log.info("group=%s member=%s revoked %s", self.group, self.member_id,
                     [f"{t}[{p}]" for t, p in tps])

    def _callback(self, callback: RebalanceCallback | None, tps: list[TP]) -> None:
        if callback is not None and tps:
            callback(list(tps))

    def _rejoin(self) -> None:
        self._expired.clear()
        lost = sorted(self._owned)
        log.warning("group=%s member=%s was expired (no heartbeat for %.1fs); rejoining; "
                    "records delivered but not committed will be redelivered",
                    self.group, self.member_id, self._session_timeout)
        self._drop(lost)
        write_tx(self._db(), self._register)
        self._callback(self._on_revoke, lost)
        self._rebalance()

    # ----------------------------------------------------------------- database writes

    def _register(self, c: sqlite3.Connection) -> None:
        c.execute("INSERT OR REPLACE INTO group_members (grp, member_id, topics, "
                  "session_timeout, last_heartbeat, client_id, pid) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (self.group, self.member_id, ",".join(self.topics), self._session_timeout,
                   time.time(), self.client_id, os.getpid()))
        bump_generation(c, self.group)

    def _leave(self, c: sqlite3.Connection) -> None:
        for table in ("group_owners", "group_members"):
            c.execute(f"DELETE FROM {table} WHERE grp = ? AND member_id = ?",
                      (self.group, self.member_id))
        bump_generation(c, self.group)

    def _write_release(self, c: sqlite3.Connection, release: list[TP]) -> None:
        c.executemany("DELETE FROM group_owners WHERE grp = ? AND topic = ? AND partition = ? "
                      "AND member_id = ?", [(self.group, t, p, self.member_id)
                                            for t, p in release])
        bump_generation(c, self.group)  # the members these partitions go to may claim them

    def _write_claim(self, c: sqlite3.Connection, claim: list[TP]) -> list[tuple[TP, int]] | None:
        """Own what is still free; return (partition, start position) pairs, or None when
        this member is no longer in the group."""
        if c.execute("SELECT 1 FROM group_members WHERE grp = ? AND member_id = ?",
                     (self.group, self.member_id)).fetchone() is None:
            return None
        # Rows of members that vanished without cleaning up would block their partitions.
        c.execute("DELETE FROM group_owners WHERE grp = ? AND member_id NOT IN "
                  "(SELECT member_id FROM group_members WHERE grp = ?)", (self.group, self.group))
        claimed = []
        for topic, p in claim:
            c.execute("INSERT INTO group_owners (grp, topic, partition, member_id) "
                      "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                      (self.group, topic, p, self.member_id))
            owner = c.execute("SELECT member_id FROM group_owners WHERE grp = ? AND topic = ? "
                              "AND partition = ?", (self.group, topic, p)).fetchone()
            if owner[0] != self.member_id:
                continue
            row = c.execute("SELECT committed FROM group_offsets WHERE grp = ? AND topic = ? "
                            "AND partition = ?", (self.group, topic, p)).fetchone()
            if row is None and self._start == "latest":
                row = c.execute("SELECT next_offset FROM log_ends WHERE topic = ? AND "
                                "partition = ?", (topic, p)).fetchone()
            claimed.append(((topic, p), row[0] if row else 0))
        return claimed

    def _write_offsets(self, c: sqlite3.Connection, offsets: dict[TP, int]) -> list[TP]:
        refused = []
        for (topic, p), offset in sorted(offsets.items()):
            owner = c.execute("SELECT member_id FROM group_owners WHERE grp = ? AND topic = ? "
                              "AND partition = ?", (self.group, topic, p)).fetchone()
            if owner is None or owner[0] != self.member_id:
                refused.append((topic, p))
                continue
            c.execute("INSERT INTO group_offsets (grp, topic, partition, committed) "
                      "VALUES (?, ?, ?, ?) ON CONFLICT (grp, topic, partition) DO UPDATE "
                      "SET committed = max(committed, excluded.committed)",
                      (self.group, topic, p, offset))
        return refused

    # -------------------------------------------------------------------------- heartbeat

    def _heartbeat_loop(self) -> None:
        try:
            conn = self._bus.connect()  # its own connection: never shared across threads
        except BusError as exc:
            log.error("group=%s member=%s cannot heartbeat: %s", self.group, self.member_id, exc)
            return
        try:
            while not self._stop.wait(self._interval):
                try:
                    if not write_tx(conn, self._beat):
                        self._expired.set()
                except sqlite3.Error as exc:
                    log.warning("group=%s member=%s heartbeat failed: %s", self.group,
                                self.member_id, exc)
        finally:
            conn.close()

    def _beat(self, c: sqlite3.Connection) -> bool:
        """Refresh our heartbeat and expire silent members; False if we were expired."""
        now = time.time()
        alive = c.execute("UPDATE group_members SET last_heartbeat = ? WHERE grp = ? AND "
                          "member_id = ?", (now, self.group, self.member_id)).rowcount == 1
        dead = [m for (m,) in c.execute(
            "SELECT member_id FROM group_members WHERE grp = ? AND "
            "last_heartbeat + session_timeout < ?", (self.group, now))]
        if dead:
            log.warning("group=%s member=%s expiring silent member(s) %s", self.group,
                        self.member_id, dead)
            for table in ("group_owners", "group_members"):
                c.executemany(f"DELETE FROM {table} WHERE grp = ? AND member_id = ?",
                              [(self.group, m) for m in dead])
            bump_generation(c, self.group)
        return alive
