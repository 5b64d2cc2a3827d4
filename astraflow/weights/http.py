"""The HTTP weight store's client, :class:`HttpStore` (its server is in
:mod:`astraflow.weights.server`; ``WeightServer`` and ``make_server`` are re-exported here).

The client trusts the server with nothing it cannot check: it follows no redirects, requires
exact ``Content-Length`` and ``Content-Range``, puts a deadline on every request, and ignores
environment proxies. Every failure is a :class:`~astraflow.core.errors.WeightStoreError`
(``BlobNotFoundError`` for a 404); the rules are in docs/weights.md#stores."""

from __future__ import annotations

import http.client
import io
import re
import time
from typing import Any, BinaryIO, cast
from urllib.parse import quote, urlsplit

from astraflow.core.errors import WeightStoreError
from astraflow.weights.netio import DeadlineReader
from astraflow.weights.server import WeightServer, make_server
from astraflow.weights.store import BlobNotFoundError, check_path

__all__ = ["DEFAULT_MIN_RATE", "HttpStore", "WeightServer", "make_server"]

DEFAULT_MIN_RATE = 1_000_000.0  # bytes/s a body may not fall below on average
_LENGTH = re.compile(r"\d{1,19}", re.ASCII)
_CONTENT_RANGE = re.compile(r"bytes (\d{1,19})-(\d{1,19})/(\d{1,19}|\*)", re.ASCII)
_NETWORK_ERRORS = (OSError, http.client.HTTPException, ValueError)


class _Unsatisfiable(WeightStoreError):
    """HTTP 416: the range starts at or past the blob's end."""


class HttpStore:
    """Client of a weight server: ``HttpStore("http://host:8000", token=...)``. Read-only."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0,
                 min_rate: float = DEFAULT_MIN_RATE) -> None:
        parts = urlsplit(base_url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if (parts.scheme not in ("http", "https") or not parts.hostname or port == -1
                or parts.query or parts.fragment or parts.username is not None):
            raise WeightStoreError(f"weight server URL {base_url!r} must be "
                                   "http(s)://host[:port][/prefix], e.g. http://trainer:8470")
        if not timeout > 0 or not min_rate > 0:
            raise WeightStoreError(f"HttpStore: timeout {timeout} and min_rate {min_rate} must "
                                   "be > 0")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.min_rate = min_rate
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._prefix = parts.path.rstrip("/")

    def __repr__(self) -> str:
        return f"HttpStore({self.base_url!r})"

    # -- one request ----------------------------------------------------------------------------
    def _request(self, method: str, path: str, headers: dict[str, str] | None = None, *,
                 deadline: float | None = None, offset: int | None = None) -> _Body:
        """Send one request and check the answer's head: a 200 (``offset`` None) or a 206 for a
        range from ``offset``, with a valid length; anything else raises."""
        target = f"{self._prefix}/{quote(check_path(path))}"
        what = f"{method} {self.base_url}/{quote(path)}"
        reader: list[DeadlineReader] = []
        head_by = deadline if deadline is not None else time.monotonic() + self.timeout

        def response_class(sock: Any, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
            resp = http.client.HTTPResponse(sock, *args, **kwargs)
            r = DeadlineReader(sock, self.timeout, head_by, keep=cast(io.IOBase, resp.fp))
            resp.fp = io.BufferedReader(r)
            reader.append(r)
            return resp

        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        conn.response_class = response_class  # type: ignore[assignment]
        sent = {"Accept-Encoding": "identity", **(headers or {})}
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, target, headers=sent)
            resp = conn.getresponse()
        except _NETWORK_ERRORS as e:
            conn.close()
            raise WeightStoreError(f"{what}: {_why(e, reader)}") from None
        try:
            length = self._check(resp, what, path, method, offset)
        except WeightStoreError:
            resp.close()
            conn.close()
            raise
        if deadline is None and reader:  # the body's own deadline, now that its length is known
            reader[0].deadline = time.monotonic() + self.timeout + length / self.min_rate
        return _Body(resp, conn, length, what, reader[0] if reader else None)

    def _check(self, resp: http.client.HTTPResponse, what: str, path: str, method: str,
               offset: int | None) -> int:
        """The answer's body length, once its status and head are what was asked for."""
        status = resp.status
        if status == 404:
            raise BlobNotFoundError(f"blob {path!r} not found at {self.base_url}")
        if status in (401, 403):
            raise WeightStoreError(f"{self.base_url} refused {path!r} (HTTP {status}); pass "
                                   "the server's --token")
        if 300 <= status < 400:
            raise WeightStoreError(
                f"{what}: HTTP {status} redirect to {str(resp.getheader('Location'))[:200]!r} "
                "not followed (it would carry the bearer token elsewhere); point the store at "
                "the final URL")
        if status == 416:
            raise _Unsatisfiable(f"{what}: HTTP 416, range from {offset} past the blob's end")
        if status == 503:
            raise WeightStoreError(f"{what}: HTTP 503, the server is busy; retried later")
        want = 200 if offset is None else 206
        if status != want:
            raise WeightStoreError(f"{what}: HTTP {status} {resp.reason[:80]!r}, expected "
                                   f"{want}" + (" (a Range request ignored)" if status == 200
                                                else ""))
        lengths = resp.headers.get_all("Content-Length") or []
        if resp.chunked or len(lengths) != 1 or not _LENGTH.fullmatch(lengths[0].strip()):
            raise WeightStoreError(f"{what}: the answer has no valid Content-Length "
                                   f"({lengths[:2]}{', chunked' if resp.chunked else ''})")
        length = int(lengths[0])
        if offset is not None:
            m = _CONTENT_RANGE.fullmatch((resp.getheader("Content-Range") or "").strip())
            if (m is None or int(m[1]) != offset or int(m[2]) - int(m[1]) + 1 != length
                    or (m[3] != "*" and int(m[3]) <= int(m[2]))):
                raise WeightStoreError(
                    f"{what}: Content-Range {str(resp.getheader('Content-Range'))[:80]!r} does "
                    f"not match the {length} bytes from offset {offset} asked for")
        return 0 if method == "HEAD" else length

    # -- the WeightStore methods ----------------------------------------------------------------
    def put(self, path: str, data: bytes | memoryview) -> None:
        raise WeightStoreError(
            f"{self!r} is read-only: the trainer writes blobs to a FileStore and serves that "
            "directory with `astraflow weights serve DIR`")

    def delete(self, path: str) -> None:
        raise WeightStoreError(f"{self!r} is read-only: blobs are deleted where they are written")

    def open(self, path: str, offset: int = 0, *, deadline: float | None = None) -> BinaryIO:
        """The blob from byte ``offset``; the stream's ``length`` is the bytes it will give."""
        if offset == 0:
            body = self._request("GET", path, deadline=deadline)
        else:
            body = self._request("GET", path, {"Range": f"bytes={offset}-"}, deadline=deadline,
                                 offset=offset)
        return cast(BinaryIO, body)

    def read(self, path: str, offset: int = 0, length: int | None = None, *,
             deadline: float | None = None) -> bytes:
        if length == 0:
            return b""
        try:
            if offset == 0 and length is None:
                body = self._request("GET", path, deadline=deadline)
            else:
                last = "" if length is None else str(offset + length - 1)
                body = self._request("GET", path, {"Range": f"bytes={offset}-{last}"},
                                     deadline=deadline, offset=offset)
        except _Unsatisfiable:
            return b""
        if length is not None and body.length > length:
            body.close()
            raise WeightStoreError(f"{body.what}: {body.length} bytes for {length} asked")
        with body:
            return body.read()

    def exists(self, path: str) -> bool:
        try:
            self._request("HEAD", path).close()
        except BlobNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        with self._request("HEAD", path) as body:
            return int(body.headers["Content-Length"])


class _Body:
    """An answer's body: never read past its ``length``; every failure a WeightStoreError."""

    def __init__(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection,
                 length: int, what: str, reader: DeadlineReader | None) -> None:
        self._resp = resp
        self._conn = conn
        self._reader = reader
        self.length = length
        self.left = length
        self.what = what
        self.status = resp.status
        self.headers = resp.headers

    def read(self, n: int | None = -1) -> bytes:
        """``n`` bytes (all that is left when negative or None), or WeightStoreError."""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self._take(self._resp.read, want)
        if len(data) < want:
            raise WeightStoreError(f"{self.what}: the body ended after "
                                   f"{self.length - self.left} of {self.length} bytes")
        return data

    def read1(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes, as soon as some are there (b"" only when nothing is left)."""
        data = self._take(self._resp.read1, self.left if n < 0 else min(n, self.left))
        if not data and self.left:
            raise WeightStoreError(f"{self.what}: the body ended after "
                                   f"{self.length - self.left} of {self.length} bytes")
        return data

    def _take(self, read: Any, want: int) -> bytes:
        if want == 0:
            return b""
        try:
            data: bytes = read(want)
        except _NETWORK_ERRORS as e:
            why = _why(e, [self._reader] if self._reader else [])
            raise WeightStoreError(f"{self.what}: {why} after {self.length - self.left} of "
                                   f"{self.length} bytes") from None
        self.left -= len(data)
        return data

    def close(self) -> None:
        self._resp.close()
        self._conn.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _why(e: BaseException, reader: list[DeadlineReader]) -> str:
    """What went wrong, in words: a passed deadline is said so (the caller may resume)."""
    if isinstance(e, TimeoutError):
        deadline = reader[0].deadline if reader else None
        if deadline is not None and time.monotonic() >= deadline - 0.01:
            return "its deadline passed (the server sends too slowly)"
        return "timed out"
    return f"{type(e).__name__}: {e}"[:300]
