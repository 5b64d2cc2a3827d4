"""Connections the gateway holds, and for how long: uvicorn's h11 protocol with a deadline for a
request's headers, a cap on open connections below the process's file-descriptor limit and a
cap per peer address (one more is closed at once, quietly), and :class:`GuardedLoop`, which
retries ``accept`` once a second when file descriptors run out and logs it at most once a
minute. uvicorn's own settings do the rest (``timeout_keep_alive``,
``h11_max_incomplete_event_size``). The limits: docs/gateway.md#limits.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections import Counter
from typing import Any

from astraflow.gateway.limits import Limits

log = logging.getLogger("astraflow.gateway.connections")

LOG_EVERY_S = 60.0  # at most one line per this many seconds for each kind of refusal


class RateLimitedLog:
    """One log line per ``every`` seconds for each key, with how many were left unsaid."""

    def __init__(self, every: float = LOG_EVERY_S) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warning(self, key: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return
        self._last[key] = now
        quiet = self._quiet.pop(key, 0)
        log.warning("%s%s", message, f" ({quiet} more since the last line)" if quiet else "")


class _QuietWarnings:
    """uvicorn's logger, with its per-request warnings ("Invalid HTTP request received.")
    rate-limited: a flood of malformed requests is one line a minute, not one per request."""

    def __init__(self, logger: logging.Logger, said: RateLimitedLog) -> None:
        # a malformed request is a warning each, in uvicorn's own logger
        self._logger, self._said = logger, said

    def warning(self, message: str, *args: Any) -> None:
        self._said.warning(f"uvicorn:{message}", message % args if args else message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def connection_cap(limits: Limits) -> int:
    """``max_connections``, lowered to leave ``fd_reserve`` file descriptors of the process's
    limit (RLIMIT_NOFILE) to the rest of the gateway (its bus, engines, logs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(1, min(limits.max_connections, soft - limits.fd_reserve))


def peer_of(transport: Any) -> str:
    """The address a connection comes from (``""``: unknown, e.g. a Unix socket)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple | list) and peer else ""


def guarded_protocol(limits: Limits, cap: int, said: RateLimitedLog) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header deadline (``limits.header_timeout_s``, from the
    connection's start or the first byte of its next request to the end of the headers), at
    most ``cap`` open connections, and at most ``limits.max_connections_per_peer`` of them
    from one address: a client that holds sockets open (before any credential is read)
    exhausts its own share, not everyone's."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    per_peer = min(cap, limits.max_connections_per_peer)
    peers: Counter[str] = Counter()  # address -> connections open from it

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _peer: str | None = None  # counted in ``peers`` while open

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.logger = _QuietWarnings(self.logger, said)  # type: ignore[assignment]

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            peer = peer_of(transport)
            if peers[peer] >= per_peer:
                said.warning("peer", f"{peers[peer]} connections are open from {peer or '?'}, "
                                     "the most one address may hold "
                                     "(gateway.max_connections_per_peer); closing its new ones")
                transport.abort()
                return
            self._peer = peer
            peers[peer] += 1
            if len(self.connections) > cap:
                said.warning("cap", f"{len(self.connections) - 1} connections are open, the "
                                    f"most this gateway holds (gateway.max_connections, within "
                                    "the file-descriptor limit); closing new ones")
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()  # headers still incomplete: nothing to answer

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
            elif self.conn.their_state is h11.IDLE:
                if self._header_timer is None:  # the first byte of the next request's headers
                    self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._peer is not None:
                peers[self._peer] -= 1
                if not peers[self._peer]:
                    del peers[self._peer]
                self._peer = None
            super().connection_lost(exc)

    return GuardedH11Protocol


class _OneFailure:
    """A listening socket whose ``accept`` fails once per loop tick at most: after the first
    "out of file descriptors" the rest of asyncio's accept loop sees "nothing to accept"."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.failed = False

    def accept(self) -> Any:
        if self.failed:
            raise BlockingIOError
        try:
            return self.sock.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.failed = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class GuardedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, but out of file descriptors it retries ``accept`` once a second, not
    once per queued connection each second (CPython 3.11's accept loop schedules a retry for
    every failed ``accept`` of its backlog-long loop and goes on: thousands of retries a
    second, each logging a traceback: a spin)."""

    def _accept_connection(self, protocol_factory: Any, sock: Any, *args: Any,
                           **kwargs: Any) -> Any:
        sock = sock.sock if isinstance(sock, _OneFailure) else sock
        return super()._accept_connection(  # type: ignore[misc]
            protocol_factory, _OneFailure(sock), *args, **kwargs)

    def _start_serving(self, protocol_factory: Any, sock: Any, *args: Any, **kwargs: Any
                       ) -> Any:
        sock = sock.sock if isinstance(sock, _OneFailure) else sock
        if sock.fileno() < 0:
            return None  # the server closed it meanwhile
        return super()._start_serving(  # type: ignore[misc]
            protocol_factory, sock, *args, **kwargs)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, said: RateLimitedLog) -> None:
    """Log asyncio's "out of file descriptors" on ``accept`` as one line a minute (asyncio
    already stops accepting for a second each time); other loop errors as before."""
    previous = loop.get_exception_handler()

    def handle(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "out of system resource" in str(context.get("message", "")):
            said.warning("accept", f"cannot accept connections: {context.get('exception')}; "
                                   "refusing new ones until file descriptors are free "
                                   "(raise `ulimit -n` or lower gateway.max_connections)")
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handle)
