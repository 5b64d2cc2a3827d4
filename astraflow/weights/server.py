"""The weight server: a small read-only HTTP server over a blob directory.

``astraflow weights serve DIR`` runs :func:`make_server`: ``GET``/``HEAD /<blob path>`` with
single ``Range`` requests, an optional bearer token, and the path checks of
:class:`~astraflow.weights.store.FileStore`; only regular files are served, never uploads. A
connection takes one of ``max_connections`` slots only once a request has shown the token;
the limits and timeouts are in docs/weights.md."""

from __future__ import annotations

import contextlib
import errno
import hmac
import io
import logging
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from astraflow.core.errors import WeightStoreError
from astraflow.weights.files import open_regular
from astraflow.weights.netio import DeadlineReader
from astraflow.weights.store import FileStore, OutsideStoreError

log = logging.getLogger("astraflow.weights.server")

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_UNAUTHENTICATED = 64
DEFAULT_AUTH_TIMEOUT_S = 5.0
_FD_RESERVE = 32  # descriptors kept for everything else the process opens
_RANGE = re.compile(r"bytes=(\d*)-(\d*)", re.ASCII)
_HUGE = 1 << 62  # stands for a range number of more digits than any file size has
_OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: how long accepting pauses after it failed for want of descriptors: the accept loop then
#: tries at most 1/ACCEPT_PAUSE_S times a second, however fast the machine
ACCEPT_PAUSE_S = 0.1


def connection_caps(served: int, unauthenticated: int) -> tuple[int, int]:
    """``(served, unauthenticated)`` lowered so that both fit the process's descriptor limit
    (with some left for everything else): an unauthenticated connection holds its socket, an
    authenticated one its socket and an open blob; the waiting ones get at most a quarter."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return served, unauthenticated
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return served, unauthenticated
    room = soft - _FD_RESERVE
    waiting = max(1, min(unauthenticated, room // 4))
    return max(1, min(served, (room - waiting) // 2)), waiting


class WeightServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of workers connecting at once

    def __init__(self, root: Path, address: tuple[str, int], token: str | None, *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
                 auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S) -> None:
        if min(max_connections, max_unauthenticated) < 1 or not min(idle_timeout_s,
                                                                    auth_timeout_s) > 0:
            raise WeightStoreError(
                f"weight server: max_connections {max_connections}, max_unauthenticated "
                f"{max_unauthenticated}, idle_timeout_s {idle_timeout_s} and auth_timeout_s "
                f"{auth_timeout_s} must all be > 0")
        self.store = FileStore(root)
        self.token = token
        #: authenticated connections served at once, and unauthenticated ones waiting to send
        #: their first request (both lowered to the descriptor limit)
        self.max_connections, self.max_unauthenticated = connection_caps(max_connections,
                                                                          max_unauthenticated)
        self.idle_timeout_s = idle_timeout_s
        self.auth_timeout_s = auth_timeout_s
        self.bytes_sent = 0  # blob bytes written to clients: this store's egress
        self.requests = 0  # GET and HEAD requests answered
        self.connections = 0  # authenticated connections open now (each holds a slot)
        self.client_errors = 0  # connections that ended with the client gone (reset, pipe)
        self.refused = 0  # authenticated requests past max_connections: 503 and closed
        self.unauthorized = 0  # requests without the token: 401 and closed, no slot taken
        self.evicted = 0  # unauthenticated connections closed to make room for a new one
        self.timed_out = 0  # connections closed because a request head was late (or stalled)
        self.accepted = 0  # connections accepted
        self.accept_failures = 0  # accepts failed for want of descriptors (each then pauses)
        self._waiting: dict[Any, float] = {}  # unauthenticated sockets, oldest first
        self._served: set[Any] = set()  # authenticated sockets
        self._count = threading.Lock()
        if (self.max_connections, self.max_unauthenticated) != (max_connections,
                                                                max_unauthenticated):
            log.info("max_connections=%d, max_unauthenticated=%d lowered to %d, %d by the "
                     "descriptor limit (ulimit -n)", max_connections, max_unauthenticated,
                     self.max_connections, self.max_unauthenticated)
        super().__init__(address, _Handler)

    @property
    def unauthenticated(self) -> int:
        """Connections open now that have not yet sent a request with the token."""
        return len(self._waiting)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a cut link, a worker killed) is routine: one
        DEBUG line, not socketserver's traceback per connection; anything else is logged
        with its traceback."""
        import sys

        err = sys.exc_info()[1]
        if isinstance(err, ConnectionResetError | BrokenPipeError | TimeoutError):
            log.debug("weight server: client %s went away: %s", client_address, err)
            self.client_errors += 1
            return
        log.exception("weight server: error serving %s", client_address)

    def count(self, requests: int = 0, sent: int = 0, timed_out: int = 0) -> None:
        with self._count:
            self.requests += requests
            self.bytes_sent += sent
            self.timed_out += timed_out

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}"

    def get_request(self) -> tuple[Any, Any]:
        try:
            got = super().get_request()
        except OSError as e:
            if e.errno in _OUT_OF_FDS:
                # the listening socket stays readable, so the loop would come straight back:
                # pause and let connections close
                self.accept_failures += 1
                if self.accept_failures == 1 or self.accept_failures % 100 == 0:
                    log.warning("accept failed (%s), %d times; pausing: raise ulimit -n or "
                                "lower max_connections", e, self.accept_failures)
                time.sleep(ACCEPT_PAUSE_S)
            raise
        self.accepted += 1
        return got

    def process_request(self, request: Any, client_address: Any) -> None:
        """A new connection waits unauthenticated; with ``max_unauthenticated`` already
        waiting, the oldest of them is closed to make room (it had the longest to speak)."""
        with self._count:
            victim = None
            if len(self._waiting) >= self.max_unauthenticated:
                victim = next(iter(self._waiting))
                del self._waiting[victim]
                self.evicted += 1
            self._waiting[request] = time.monotonic()
        if victim is not None:
            if self.evicted == 1 or self.evicted % 100 == 0:
                log.warning("max_unauthenticated=%d connections wait for a first request: "
                            "closed the oldest to make room for %s; %d closed so far",
                            self.max_unauthenticated, client_address[0], self.evicted)
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)  # its thread reads EOF and ends
        try:
            super().process_request(request, client_address)  # a thread per connection
        except BaseException:
            self._release(request)
            raise

    def authenticated(self, request: Any) -> bool:
        """Move ``request`` from the waiting connections into a worker's slot; False when
        every slot is taken (or it was closed to make room meanwhile)."""
        with self._count:
            if request in self._served:
                return True
            if request not in self._waiting:  # closed to make room meanwhile
                return False
            if self.connections >= self.max_connections:
                self.refused += 1
                return False
            del self._waiting[request]
            self._served.add(request)
            self.connections += 1
            return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: Any) -> None:
        with self._count:
            self._waiting.pop(request, None)
            if request in self._served:
                self._served.discard(request)
                self.connections -= 1


class _Handler(BaseHTTPRequestHandler):
    server: WeightServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self._slot = False  # holds one of the server's max_connections (authenticated)
        first = self.server.auth_timeout_s
        self.connection.settimeout(first)  # each read or write on the socket
        self._reader = DeadlineReader(self.connection, first, keep=self.rfile)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # the next request head must arrive whole within the timeout (the short one before
        # the token was shown), however it drips
        wait = self.server.idle_timeout_s if self._slot else self.server.auth_timeout_s
        self._reader.deadline = time.monotonic() + wait
        self._reader.timed_out = False
        super().handle_one_request()
        if self._reader.timed_out:  # the stdlib closes the connection; counted here
            self.server.count(timed_out=1)
        if not self._slot:  # one try without a slot: a 401, a malformed request, EOF
            self.close_connection = True

    def parse_request(self) -> bool:
        ok = super().parse_request()  # the request line and headers are read now
        self._reader.deadline = None
        self.connection.settimeout(self.server.idle_timeout_s)  # for the answer's writes
        return ok

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def _error(self, code: int, message: str, headers: dict[str, str] | None = None) -> None:
        data = (message + "\n").encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _serve(self, body: bool) -> None:
        self.server.count(requests=1)
        token = self.server.token
        if token is not None:
            got = self.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
                self.server.unauthorized += 1
                self.close_connection = True
                self._error(401, "missing or wrong bearer token",
                            {"WWW-Authenticate": 'Bearer realm="astraflow-weights"'})
                return
        if not self._slot:
            self._slot = self.server.authenticated(self.request)
            if not self._slot:
                if self.server.refused == 1 or self.server.refused % 100 == 0:
                    log.warning("request from %s refused (503): max_connections=%d are served; "
                                "%d refused so far", self.client_address[0],
                                self.server.max_connections, self.server.refused)
                self.close_connection = True
                self._error(503, "the weight server is busy; retry later", {"Retry-After": "1"})
                return
        path = unquote(urlsplit(self.path).path).removeprefix("/")
        try:
            # only a regular file is served, opened without waiting: a FIFO left in the store
            # would otherwise hold this thread in open() for ever
            f = open_regular(self.server.store.local_path(path))
        except OutsideStoreError:  # a symlink that leads out of the store
            self._error(403, f"blob {path!r} is outside the store")
            return
        except WeightStoreError as e:
            self._error(400, str(e))
            return
        except OSError:  # absent, a directory, a FIFO or a device, pruned meanwhile
            self._error(404, f"no blob {path!r}")
            return
        with f:
            self._send(f, os.fstat(f.fileno()).st_size, path, body)

    def _send(self, f: BinaryIO, size: int, path: str, body: bool) -> None:
        start, end = 0, size  # [start, end)
        status = 200
        m = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        if m and (m[1] or m[2]):
            if m[1]:
                start = _number(m[1])
                end = min(size, _number(m[2]) + 1) if m[2] else size
            else:  # suffix range: the last N bytes
                start = max(0, size - _number(m[2]))
            if start >= size or start >= end:
                self._error(416, f"range {self.headers['Range'][:60]!r} outside {size} bytes",
                            {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        self.send_response(status)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        try:
            f.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                self.server.count(sent=len(chunk))
                remaining -= len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            log.debug("client went away or stopped reading during %s", path)
            self.server.client_errors += 1
            self.close_connection = True


def _number(digits: str) -> int:
    """A range bound; one longer than any file size could be is read as 'huge' (Python refuses
    to parse integers of thousands of digits, and no file is that large anyway)."""
    return int(digits) if len(digits) <= 18 else _HUGE


def make_server(root: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
                auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S) -> WeightServer:
    """A server for the blobs under ``root`` (call ``serve_forever()``; port 0 picks a free
    one). The limits: see the module's docstring."""
    root = Path(root)
    if not root.is_dir():
        raise WeightStoreError(f"weight store directory {root} does not exist")
    return WeightServer(root, (host, port), token, max_connections=max_connections,
                        idle_timeout_s=idle_timeout_s, max_unauthenticated=max_unauthenticated,
                        auth_timeout_s=auth_timeout_s)
