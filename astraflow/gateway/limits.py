"""What one request may cost the gateway, checked before the cost is paid: the body's size
(413, read no further), how long its body may take to arrive (408), how many messages and
how large each (400), and tokenization, which runs on a small thread pool so the event loop
(``/health``, every other session) never waits for a long prompt (429 when too many wait).

The connection-level limits (header and idle deadlines, the connection cap, running out of
file descriptors) are :mod:`astraflow.gateway.connections`'; both read :class:`Limits`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from astraflow.gateway.errors import GatewayError, too_many

log = logging.getLogger("astraflow.gateway.limits")

T = TypeVar("T")
TOKENIZER_THREAD = "af-tokenize"  # the name prefix of the tokenization threads


@dataclass(frozen=True)
class Limits:
    """Per-request and per-connection limits (``gateway.*`` in the config; docs/gateway.md)."""

    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0
    max_messages: int = 2048
    max_message_chars: int = 1 << 20
    max_tokenizing: int = 2
    max_tokenize_waiting: int = 64
    retry_after_s: int = 1
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    max_header_bytes: int = 16 << 10
    max_connections: int = 1024
    fd_reserve: int = 64
    max_connections_per_peer: int = 256
    allowed_hosts: tuple[str, ...] = ()


def limits_of(gc: Any) -> Limits:
    """The :class:`Limits` of a ``gateway`` config section."""
    return Limits(max_body_bytes=gc.max_body_bytes, body_timeout_s=gc.body_timeout_s,
                  max_messages=gc.max_messages, max_message_chars=gc.max_message_chars,
                  max_tokenizing=gc.max_tokenizing, max_tokenize_waiting=gc.max_tokenize_waiting,
                  retry_after_s=gc.retry_after_s, header_timeout_s=gc.header_timeout_s,
                  idle_timeout_s=gc.idle_timeout_s, max_header_bytes=gc.max_header_bytes,
                  max_connections=gc.max_connections,
                  max_connections_per_peer=gc.max_connections_per_peer,
                  allowed_hosts=tuple(gc.allowed_hosts))


# -- the body ------------------------------------------------------------------------------------

class BodyLimit:
    """ASGI middleware: reads a request's body before the app sees it, no further than
    ``max_bytes`` (a larger ``Content-Length`` is refused before a byte of it is read) and
    no longer than ``timeout_s``; then hands the app the body whole. A refusal closes the
    connection (the rest of the body is never read). ``on_reject(status)``: counts it."""

    def __init__(self, app: Any, *, max_bytes: int, timeout_s: float,
                 on_reject: Callable[[int], None] | None = None) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        self.on_reject = on_reject

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send, 413, self._too_large(f"{int(length)} bytes"))
            return
        chunks: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # the client left; nobody to answer
                    chunk = message.get("body", b"")
                    total += len(chunk)
                    if total > self.max_bytes:
                        await self._refuse(send, 413, self._too_large("more"))
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(send, 408, GatewayError(
                408, f"the request body did not arrive within {self.timeout_s:g} s "
                     "(gateway.body_timeout_s); send it at once", code="request_timeout"))
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, for a streamed answer

        await self.app(scope, replay, send)

    def _too_large(self, size: str) -> GatewayError:
        return GatewayError(413, f"the request body is {size} than the {self.max_bytes} bytes "
                                 "this gateway reads (gateway.max_body_bytes); send fewer or "
                                 "shorter messages", code="request_too_large")

    async def _refuse(self, send: Any, status: int, e: GatewayError) -> None:
        if self.on_reject is not None:
            self.on_reject(status)
        raw = msgspec.json.encode(e.body())
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(raw)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": raw})


# -- messages --------------------------------------------------------------------------------------

def _chars(value: Any) -> int:
    """Characters of the text in a message's field (a string, parts, tool calls)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if hasattr(value, "__dict__"):
        return _chars(vars(value))
    return 0


def check_messages(messages: list[Any], limits: Limits) -> None:
    """400 when a chat request has more than ``max_messages`` messages or one of them more
    than ``max_message_chars`` characters."""
    if len(messages) > limits.max_messages:
        raise GatewayError(400, f"messages has {len(messages)} messages; this gateway takes at "
                                f"most {limits.max_messages} (gateway.max_messages)",
                           param="messages", code="too_many_messages")
    for i, m in enumerate(messages):
        n = _chars(m)
        if n > limits.max_message_chars:
            raise GatewayError(400, f"messages[{i}] has {n} characters; this gateway takes at "
                                    f"most {limits.max_message_chars} per message "
                                    "(gateway.max_message_chars)", param=f"messages.{i}",
                               code="message_too_long")


def check_prompt(prompt: Any, limits: Limits) -> None:
    """400 when a completion's text prompt is longer than ``max_message_chars``."""
    if isinstance(prompt, str) and len(prompt) > limits.max_message_chars:
        raise GatewayError(400, f"prompt has {len(prompt)} characters; this gateway takes at "
                                f"most {limits.max_message_chars} (gateway.max_message_chars)",
                           param="prompt", code="message_too_long")


# -- tokenization ----------------------------------------------------------------------------------

class Tokenizing:
    """Runs tokenization (a request's rendering to ids; a session call's planning, which
    tokenizes the messages it adds) on ``workers`` threads named
    ``af-tokenize-*``, never on the event loop; with ``workers + waiting`` already there, a
    request is answered 429 with Retry-After rather than queued without bound."""

    def __init__(self, workers: int, waiting: int, retry_after_s: int) -> None:
        self.limit = workers + waiting
        self.retry_after_s = retry_after_s
        self.pending = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=TOKENIZER_THREAD)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.pending >= self.limit:
            raise too_many(f"{self.pending} requests are being tokenized or waiting, the most "
                           "this gateway holds (gateway.max_tokenizing + "
                           "gateway.max_tokenize_waiting); retry later", self.retry_after_s)
        self.pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, functools.partial(fn, *args))
        finally:
            self.pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
