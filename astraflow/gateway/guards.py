"""Who may reach the gateway through a browser, and how large a request's head may be: two
ASGI wrappers that answer before any route (or the body) is read.

:class:`HostCheck`: without a credential, a request whose ``Host`` or ``Origin`` is not
loopback is refused (403), so a web page cannot reach a local gateway;
``gateway.allowed_hosts`` lists more names to take. ``/health`` is open.

:class:`HeadLimit`: a request line and headers larger than ``gateway.max_header_bytes`` are a
431, however they arrived. Details: docs/gateway.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from astraflow.gateway.auth import OPEN_PATHS, authenticated, is_loopback
from astraflow.gateway.errors import error_body


async def _refuse(send: Any, status: int, message: str, code: str) -> None:
    raw = json.dumps(error_body(message, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": raw})


def head_bytes(scope: dict[str, Any]) -> int:
    """The size of a request's head as sent: ``METHOD target HTTP/x.y`` and a ``name: value``
    line per header, each with its CRLF, and the empty line."""
    target = len(scope.get("raw_path") or scope["path"].encode())
    query = scope.get("query_string", b"")
    line = len(scope["method"]) + 1 + target + (1 + len(query) if query else 0) + 11
    return line + sum(len(n) + 2 + len(v) + 2 for n, v in scope["headers"]) + 2


class HeadLimit:
    """ASGI wrapper: a request whose head is over ``max_bytes`` is answered 431 (and the
    connection closed) before the app sees it."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = head_bytes(scope)
            if size > self.max_bytes:
                await _refuse(send, 431, f"the request's head (request line and headers) is "
                                         f"{size} bytes; this gateway takes at most "
                                         f"{self.max_bytes} (gateway.max_header_bytes)",
                              "headers_too_large")
                return
        await self.app(scope, receive, send)


def host_of(value: str, *, origin: bool = False) -> str:
    """The host name, lower case, of a ``Host`` header (``name``, ``name:port``,
    ``[v6]:port``) or of an ``Origin`` (``scheme://host[:port]``); ``""`` when it names none
    (an Origin of ``null``: a sandboxed page, a file)."""
    try:
        return (urlsplit(value if origin else f"//{value}").hostname or "").lower()
    except ValueError:
        return ""


class HostCheck:
    """ASGI middleware: the Host and Origin rule of the module docstring. ``allowed``: the
    host names taken besides loopback ones (``gateway.allowed_hosts``)."""

    def __init__(self, app: Any, allowed: Sequence[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(h.lower() for h in allowed)

    def _ok(self, host: str, scope: dict[str, Any]) -> bool:
        if is_loopback(host) or "*" in self.allowed or host in self.allowed:
            return True
        return not self.allowed and authenticated(scope)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if host is not None and not self._ok(host_of(host), scope):
            await _refuse(send, 403, f"Host {host[:100]!r} is not one this gateway answers: "
                                     "without a token it answers loopback names only; list "
                                     "the names it is reached by in gateway.allowed_hosts",
                          "host_not_allowed")
            return
        if origin is not None and not self._ok(host_of(origin, origin=True), scope):
            await _refuse(send, 403, f"Origin {origin[:100]!r} may not call this gateway: "
                                     "without a token only pages of loopback origins may; list "
                                     "trusted hosts in gateway.allowed_hosts",
                          "origin_not_allowed")
            return
        await self.app(scope, receive, send)
