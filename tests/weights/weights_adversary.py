"""Adversarial HTTP peers for the weights tests: real sockets in threads, no mocks.

:class:`RawServer` accepts TCP connections, reads one request's head and hands the socket to a
``respond(conn, request)`` function that writes whatever bytes the test wants — a drip, a lie
about the length, a redirect, garbage — so the client meets what a broken or hostile server
really sends. :func:`serve_files` is a well-behaved responder (ranges included) to compose
with bad ones.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names


Respond = Callable[[socket.socket, Request], None]


class RawServer:
    """A TCP server answering every connection with ``respond`` (in a thread per connection).
    ``requests`` lists what it was asked, in order."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _addr = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn:
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    got = conn.recv(4096)
                    if not got:
                        return
                    head += got
                line, *rest = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                method, path, _version = line.split(" ", 2)
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (h.partition(":") for h in rest)}
                req = Request(method, path, headers)
                self.requests.append(req)
                self.respond(conn, req)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


def reply(raw: bytes) -> Respond:
    """A responder that sends ``raw`` (status line, headers and body) and closes."""

    def respond(conn: socket.socket, req: Request) -> None:
        conn.sendall(raw)

    return respond


def serve_files(root: Path) -> Respond:
    """A correct responder for the blobs under ``root``: 200, or 206 for ``bytes=a-[b]``."""

    def respond(conn: socket.socket, req: Request) -> None:
        p = root / unquote(req.path.lstrip("/"))
        if not p.is_file():
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        data = p.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", req.headers.get("range", ""))
        status, extra = "200 OK", ""
        if m:
            start = int(m[1])
            end = min(len(data), int(m[2]) + 1) if m[2] else len(data)
            status = "206 Partial Content"
            extra = f"Content-Range: bytes {start}-{end - 1}/{len(data)}\r\n"
            data = data[start:end]
        body = b"" if req.method == "HEAD" else data
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(data)}\r\n{extra}"
                     "Connection: close\r\n\r\n".encode() + body)

    return respond


def drip(head: bytes, body: bytes, every: float, stop_after: float = 10.0) -> Respond:
    """Send ``head`` at once, then ``body`` one byte every ``every`` seconds (gives up after
    ``stop_after`` seconds so that a client without a deadline does not hang the test)."""

    def respond(conn: socket.socket, req: Request) -> None:
        conn.sendall(head)
        end = time.monotonic() + stop_after
        for b in body:
            if time.monotonic() > end:
                return
            conn.sendall(bytes([b]))
            time.sleep(every)

    return respond


def stream(head: bytes, total: int, chunk: int = 1 << 16) -> Respond:
    """Send ``head``, then ``total`` bytes of zeros (or until the client goes away)."""

    def respond(conn: socket.socket, req: Request) -> None:
        conn.sendall(head)
        left = total
        with contextlib.suppress(OSError):
            while left > 0:
                n = min(chunk, left)
                conn.sendall(bytes(n))
                left -= n

    return respond
