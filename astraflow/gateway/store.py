"""The gateway's sessions and the bus under them (:class:`SessionStore`).

Every event is produced and flushed before it changes a session, so an answered call is
durable, and a restarted gateway rebuilds its open sessions from the ``gateway`` topic
(:meth:`SessionStore.rebuild`). A session with its end and its reward is turned into
Trajectory records, then closed. Lookups for a client (``owner``) see only its sessions. Bus
calls run on a thread of their own; sessions are touched on the event loop only. With
``bus=None`` nothing is recorded and a session stays open until its owner takes it
(:meth:`SessionStore.take`). See docs/gateway.md#durability.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from astraflow.core.bus.reader import read_all
from astraflow.core.bus.types import Bus, Message
from astraflow.core.claims import BlobStore, unclaim
from astraflow.core.errors import SchemaError
from astraflow.core.limits import send_or_shrink
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.outputs import Output
from astraflow.core.records import GatewayCall, decode
from astraflow.core.topics import TOPICS, parse_topic, record_key, topic_name
from astraflow.gateway.cache import CacheSize, SizedCache
from astraflow.gateway.errors import bad_request, conflict, not_found, too_many
from astraflow.gateway.session import Session
from astraflow.gateway.trajectory import trajectories

log = logging.getLogger("astraflow.gateway.store")

T = TypeVar("T")
CLOSED_RETENTION_S = 3600.0  # gateway.closed_session_retention_s' default
IDEMPOTENCY_CACHE_BYTES = 64 << 20  # gateway.idempotency_cache_bytes' default
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def check_session_id(sid: str) -> str:
    """``sid``, when the whole of it is a valid id (``fullmatch``: a ``$`` would let a
    trailing newline through); else 400."""
    if not SESSION_ID.fullmatch(sid):
        raise bad_request(f"invalid session id {sid[:140]!r}: use 1-128 letters, digits, '.', "
                          "'_', ':', '@' or '-', starting with a letter or digit",
                          param="session_id", code="invalid_session_id")
    return sid


class SessionStore:
    """Open sessions of one gateway, recorded on ``bus`` (run ``run``); ``bus=None``: in
    memory (see the module docstring), the ids of the last ``idempotency_cache`` closed
    sessions remembered."""

    def __init__(self, bus: Bus | None, *, run: str = "", max_open_sessions: int = 256,
                 retry_after_s: int = 1, claims: BlobStore | None = None,
                 worker_id: str = "gateway", metrics: MetricsEmitter | None = None,
                 versions: Callable[[], Mapping[str, int]] = dict,
                 idempotency_cache: int = 4096, idle_timeout_s: float | None = None,
                 max_open_per_owner: int | None = None,
                 closed_retention_s: float | None = CLOSED_RETENTION_S,
                 idempotency_cache_bytes: int = IDEMPOTENCY_CACHE_BYTES,
                 require_group: bool = False) -> None:
        self.bus = bus
        self.require_group = require_group
        self.topic = topic_name(run, "gateway") if bus is not None else ""
        self.out_topic = topic_name(run, "trajectories") if bus is not None else ""
        self.max_open_sessions = max_open_sessions
        self.max_open_per_owner = max_open_per_owner or max_open_sessions
        self.closed_retention_s = closed_retention_s
        self.idle_timeout_s = idle_timeout_s if bus is not None else None
        self.retry_after_s = retry_after_s
        self.claims = claims
        self.worker_id = worker_id
        self.metrics = metrics
        self.versions = versions  # policy -> engine version now (the trajectories' vector)
        self.sessions: dict[str, Session] = {}
        # closed sessions, oldest first: their last info, the responses of their reward/end
        # keys, their owner, when they closed
        self.closed: dict[str, tuple[dict[str, Any], dict[str, bytes], str, float]] = {}
        self._locks: dict[str, _Lock] = {}
        self._opening: Counter[str] = Counter()  # owner -> sessions being opened (reserved)
        self._pending: dict[tuple[str, str], asyncio.Future[None]] = {}
        # the responses of calls without a session, by their (caller-scoped) keys
        self._loose: SizedCache[bytes] = SizedCache(idempotency_cache_bytes, len,
                                                    max_entries=idempotency_cache)
        self._loose_max = idempotency_cache
        self._pool: ThreadPoolExecutor | None = None
        self._producer: Any = None
        if bus is None:
            return
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="af-gateway-bus")
        for name in (self.topic, self.out_topic):  # usually made with the run's topics
            if name not in bus.list_topics():
                bus.create_topics({name: TOPICS[parse_topic(name).name].partitions})
        self._producer = bus.producer(client_id=worker_id)

    def count(self, name: str, n: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, n)

    # -- restart ---------------------------------------------------------------------------------
    def rebuild(self) -> int:
        """Read the whole ``gateway`` topic and fold it into sessions (blocking; call before
        serving). Sessions ended and rewarded but not closed are closed now. Returns the
        number of events read (in memory: 0)."""
        if self.bus is None:
            return 0
        n = 0
        for msg in read_all(self.bus, self.topic, client_id=f"{self.worker_id}-rebuild"):
            self._take(msg)
            n += 1
        for sid in [sid for sid, s in self.sessions.items() if s.done]:
            self._close(sid, at=self.sessions[sid].last_active)  # closed by its done event
        self.closed = dict(sorted(self.closed.items(), key=lambda kv: kv[1][3]))
        self.forget_closed()
        now = time.time()
        for s in list(self.sessions.values()):
            s.last_active = max(s.last_active, now)  # a full idle timeout from the restart
            if complete(s):
                self._produce_trajectories(s)
        log.info("rebuilt %d open sessions from %d events on %s", len(self.sessions), n,
                 self.topic)
        return n

    def _take(self, msg: Message) -> None:
        try:
            ev = decode(unclaim(msg, self.claims).value, GatewayCall)
        except SchemaError as e:
            log.warning("skipped record origin=%s error=%s", msg.origin, e)
            self.count("bad_records")
            return
        assert isinstance(ev, GatewayCall)
        if ev.session_id in self.closed:
            return
        s = self.sessions.get(ev.session_id)
        if s is None:
            s = self.sessions[ev.session_id] = Session(ev.session_id)
        s.apply(ev)

    # -- sessions --------------------------------------------------------------------------------
    @property
    def open_count(self) -> int:
        return len(self.sessions)

    def get(self, sid: str, owner: str | None = None) -> Session:
        """A known session (open or waiting for its reward) of ``owner``; 404 otherwise (also
        another client's), 409 if closed."""
        s = self.sessions.get(check_session_id(sid))
        if s is None or not _owns(owner, s.owner):
            closed = self.closed.get(sid)
            if s is None and closed is not None and _owns(owner, closed[2]):
                raise conflict(f"session {sid!r} is closed: its trajectories were produced",
                               code="session_closed")
            raise _no_session(sid)
        return s

    async def open(self, sid: str, meta: Mapping[str, Any], *, same_meta: bool = False,
                   owner: str | None = None) -> tuple[Session, bool]:
        """The session ``sid``, opened (recorded) with ``meta`` by ``owner`` if new;
        (session, created). 429 when ``max_open_sessions`` are open; 404 if another client's;
        409 if closed, or (``same_meta``) if it exists with other metadata (otherwise ``meta``
        is ignored for an existing one)."""
        check_session_id(sid)
        async with self.lock(sid):
            s = self.sessions.get(sid)
            closed = self.closed.get(sid)
            held = s.owner if s is not None else closed[2] if closed is not None else None
            if held is not None and not _owns(owner, held):
                raise _no_session(sid)
            if s is not None:
                if same_meta and any(getattr(s, k) != v for k, v in meta.items()
                                        if v is not None):
                    raise conflict(f"session {sid!r} exists with other metadata",
                                   code="session_exists")
                return s, False
            if sid in self.closed:
                raise conflict(f"session {sid!r} is closed: its trajectories were produced; "
                               "use a new session id", code="session_closed")
            if self.require_group:
                check_group(sid, meta)
            who = owner or ""
            self._admit(who)
            ev = GatewayCall(session_id=sid, seq=0, kind="open", owner=who,
                             **{k: v for k, v in meta.items() if v is not None})
            s = Session(sid)
            self._opening[who] += 1  # its slot, held while the open event is recorded
            try:
                await self._record(s, ev)
            finally:
                self._opening[who] -= 1
                if not self._opening[who]:
                    del self._opening[who]
            self.sessions[sid] = s
            self.count("sessions_opened")
            return s, True

    def _admit(self, owner: str) -> None:
        """429 unless one more session fits: ``max_open_sessions`` open or being opened in
        all, ``max_open_per_owner`` of them ``owner``'s."""
        total = len(self.sessions) + sum(self._opening.values())
        if total >= self.max_open_sessions:
            self.count("rejected_full")
            raise too_many(f"{total} sessions are open, the most this gateway takes "
                           "(gateway.max_open_sessions); end sessions or retry later",
                           self.retry_after_s)
        mine = self._opening[owner] + sum(1 for s in self.sessions.values()
                                          if s.owner == owner)
        if mine >= self.max_open_per_owner:
            self.count("rejected_client_full")
            raise too_many(f"this client has {mine} sessions open, the most one client may "
                           "hold (gateway.max_open_sessions_per_client); end sessions or "
                           "retry later", self.retry_after_s)

    @contextlib.asynccontextmanager
    async def lock(self, sid: str) -> AsyncIterator[None]:
        """Hold session ``sid``'s lock. A lock lives while someone holds or waits for it, or
        while its session is open: a refused or closed id leaves none behind."""
        lk = self._locks.get(sid)
        if lk is None:
            lk = self._locks[sid] = _Lock()
        lk.users += 1
        try:
            async with lk.lock:
                yield
        finally:
            lk.users -= 1
            if not lk.users and sid not in self.sessions and self._locks.get(sid) is lk:
                del self._locks[sid]

    async def record(self, s: Session, **fields: Any) -> GatewayCall:
        """Produce and flush the next event of ``s`` (its seq is assigned here), then fold it.
        The caller holds ``lock(s.id)``."""
        ev = GatewayCall(session_id=s.id, seq=s.next_seq, **fields)
        await self._record(s, ev)
        return ev

    async def _record(self, s: Session, ev: GatewayCall) -> None:
        if self.bus is not None:
            await self.on_bus(self._send, [Output(self.topic, ev, record_key("gateway", ev))])
        s.apply(ev)

    async def finish(self, s: Session) -> int:
        """Produce ``s``'s trajectories when it has ended and has its reward, then close it;
        returns how many (0: not yet; in memory: never, :meth:`take` closes). The caller
        holds ``lock(s.id)``."""
        if not complete(s) or s.done or self.bus is None:
            return 0
        outs, done = self._closing(s)
        await self.on_bus(self._send, outs)
        return self._closed(s, done, len(outs) - 1)

    def _produce_trajectories(self, s: Session) -> int:
        outs, done = self._closing(s)
        self._send(outs)
        return self._closed(s, done, len(outs) - 1)

    def _closing(self, s: Session) -> tuple[list[Output], GatewayCall]:
        recs = trajectories(s, worker_id=self.worker_id, version_vector=self.versions())
        done = GatewayCall(session_id=s.id, seq=s.next_seq, kind="done")
        return ([Output(self.out_topic, r, record_key("trajectories", r)) for r in recs]
                + [Output(self.topic, done, record_key("gateway", done))]), done

    def _closed(self, s: Session, done: GatewayCall, n: int) -> int:
        s.apply(done)
        self._close(s.id)
        self.count("sessions_done")
        self.count("trajectories", n)
        return n

    def idle(self, now: float) -> list[Session]:
        """The sessions idle past ``idle_timeout_s`` at ``now`` (none without a timeout)."""
        return [s for s in self.sessions.values() if self._idle(s, now)]

    def _idle(self, s: Session, now: float) -> bool:
        t = self.idle_timeout_s
        return t is not None and not s.done and not s.busy and now - s.last_active > t

    async def abandon(self, s: Session, now: float) -> bool:
        """End ``s`` as abandoned and produce its trajectories, if it is still idle at ``now``
        once its lock is held; whether it did."""
        async with self.lock(s.id):
            if not self._idle(s, now) or self.sessions.get(s.id) is not s:
                return False
            await self.record(s, kind="end", reason="abandoned")
            self.count("sessions_abandoned")
            log.info("session=%s abandoned: idle for %.0f s (gateway.session_idle_timeout_s)",
                     s.id, now - s.last_active)
            await self.finish(s)
            return True

    async def take(self, sid: str) -> Session:
        """Close ``sid`` and hand over its session (its calls as recorded): once its calls in
        flight are recorded, later ones get 409. For the owner of an in-memory session."""
        s = self.get(sid)
        async with self.lock(sid):
            s.done = True
            self._close(sid)
        self.count("sessions_done")
        return s

    def _close(self, sid: str, at: float | None = None) -> None:
        s = self.sessions.pop(sid, None)
        lk = self._locks.get(sid)
        if lk is not None and not lk.users:
            del self._locks[sid]
        if s is not None:
            keys = {k: v for k, v in s.keys.items() if len(v) < 4096}
            self.closed[sid] = (self.info(s), keys, s.owner, time.time() if at is None else at)
            if self.bus is None and len(self.closed) > self._loose_max:
                del self.closed[next(iter(self.closed))]
        self.forget_closed()

    def forget_closed(self, now: float | None = None) -> int:
        """Forget the sessions closed more than ``closed_retention_s`` before ``now``
        (default: now); how many. A forgotten id is unknown: a call to it opens a new session,
        a retried reward or end is a 404."""
        if self.closed_retention_s is None:
            return 0
        horizon = (time.time() if now is None else now) - self.closed_retention_s
        n = 0
        for sid, closed in list(self.closed.items()):  # oldest first
            if closed[3] > horizon:
                break
            del self.closed[sid]
            n += 1
        return n

    def footprint(self) -> Footprint:
        """What the store holds in memory now (sessions, closed ids, locks, cached answers)."""
        return Footprint(open=len(self.sessions), closed=len(self.closed),
                         locks=len(self._locks), opening=sum(self._opening.values()),
                         idempotency=self._loose.size())

    def info(self, s: Session) -> dict[str, Any]:
        """What ``GET /sessions/{id}`` answers."""
        return {"id": s.id, "task_id": s.task_id, "group_id": s.group_id,
                "sample_index": s.sample_index, "group_size": s.group_size, "agent": s.agent,
                "calls": len(s.calls), "drift": s.drift, "branches": s.branches,
                "segments": {p: len(s.segments(p)) for p in s.policies()},
                "reward": s.reward, "ended": s.ended, "done": s.done,
                "end_reason": s.end_reason,
                # the Trajectory records it gives (produced when done): one per segment
                "trajectories": sum(len(s.segments(p)) for p in s.policies())}

    def info_of(self, sid: str, owner: str | None = None) -> dict[str, Any]:
        closed = self.closed.get(check_session_id(sid))
        if closed is not None and sid not in self.sessions:
            if not _owns(owner, closed[2]):
                raise _no_session(sid)
            return closed[0]
        return self.info(self.get(sid, owner))

    def closed_key(self, sid: str, key: str, owner: str | None = None) -> bytes | None:
        """The response of a reward or end with ``key`` of a closed session of ``owner``."""
        closed = self.closed.get(sid)
        return None if closed is None or not _owns(owner, closed[2]) else closed[1].get(key)

    def _send(self, outs: list[Output]) -> None:
        assert self.bus is not None  # recorded only on a bus
        for out in outs:
            send_or_shrink(self._producer, out, claims=self.claims,
                           limit=self.bus.max_message_bytes)
        self._producer.flush()

    async def on_bus(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the store's bus thread (every bus call of the store runs there);
        in memory, here."""
        if self._pool is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- idempotency -------------------------------------------------------------------------------
    def replay(self, sid: str | None, key: str, owner: str | None = None) -> bytes | None:
        """The response recorded for ``key`` (in session ``sid`` of ``owner``, or among calls
        without one)."""
        if sid is None:
            return self._loose.get(key)
        s = self.sessions.get(sid)
        return None if s is None or not _owns(owner, s.owner) else s.keys.get(key)

    def remember(self, key: str, response: bytes) -> None:
        """Keep the response of a call without a session for its key's retries."""
        self._loose.put(key, response)

    @contextlib.contextmanager
    def claim(self, sid: str | None, key: str) -> Iterator[asyncio.Future[None] | None]:
        """Yields None to the first request with ``key`` (it runs), or to a retry while that
        one runs, a future done when it has answered or failed: look for its answer again."""
        k = (sid or "", key)
        running = self._pending.get(k)
        if running is not None:
            yield running
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[k] = fut
        try:
            yield None
        finally:
            self._pending.pop(k, None)
            fut.set_result(None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._producer.close()



class _Lock:
    """A session's lock and how many hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


@dataclass(frozen=True)
class Footprint:
    """What a :class:`SessionStore` holds in memory (:meth:`SessionStore.footprint`)."""

    open: int  # sessions open
    closed: int  # closed session ids remembered (closed_retention_s)
    locks: int  # session locks
    opening: int  # sessions being opened (slots reserved)
    idempotency: CacheSize  # answers kept for Idempotency-Key retries of calls without one


def check_group(sid: str, meta: Mapping[str, Any]) -> None:
    """400 ``missing_group`` unless ``meta`` puts session ``sid`` in a group of 2 or more
    (``require_group``): every advantage is relative to the other samples of the group, so a
    group of one, or samples that never meet in one group, train nothing."""
    group, size = meta.get("group_id"), meta.get("group_size")
    if group and size is not None and size >= 2:
        return
    what = ("no group id" if not group else "no group size" if size is None
            else f"group size {size}")
    raise bad_request(
        f"session {sid!r} has {what}: its reward is compared with the other samples of its "
        "prompt (the group), so a session alone trains nothing. Give every sample of one "
        "prompt the same group id and the group's size, on the session's first call (headers "
        "X-Group-Id: ID, X-Group-Size: N >= 2, X-Sample-Index: i) or with POST /sessions "
        '{"session_id", "group_id", "group_size", "sample_index"}; or set '
        "gateway.require_group: false to record it anyway", param="group_id",
        code="missing_group")


def complete(s: Session) -> bool:
    """Whether ``s`` gives its trajectories now: ended with its reward, or abandoned."""
    return s.ended and (s.reward is not None or s.end_reason == "abandoned")


def _owns(client: str | None, owner: str) -> bool:
    return client is None or client == owner


def _no_session(sid: str) -> Exception:
    return not_found(f"no session {sid!r}: open one with POST /sessions or make a call under "
                     "/sessions/{id}/v1", param="session_id", code="session_not_found")
