"""The HTTP weight store: a small read-only server over a blob directory and its client.

``astraflow weights serve DIR`` runs :func:`make_server`: ``GET``/``HEAD /<blob path>`` with
single ``Range: bytes=`` requests (206 partial content, 416 when unsatisfiable), an optional
bearer token, and the same path checks as :class:`~astraflow.weights.store.FileStore`. Workers
pull (outbound connections only), so hosts behind NAT reach it. Writes go to the directory
directly (the trainer's FileStore); the server never accepts uploads.
"""

from __future__ import annotations

import hmac
import logging
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO, cast
from urllib.parse import quote, unquote, urlsplit

from astraflow.core.errors import WeightStoreError
from astraflow.weights.store import BlobNotFoundError, FileStore, check_path

log = logging.getLogger("astraflow.weights.http")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class WeightServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, address: tuple[str, int], token: str | None) -> None:
        self.store = FileStore(root)
        self.token = token
        self.bytes_sent = 0  # blob bytes written to clients: this store's egress
        self.requests = 0  # GET and HEAD requests answered
        self._count = threading.Lock()
        super().__init__(address, _Handler)

    def count(self, requests: int = 0, sent: int = 0) -> None:
        with self._count:
            self.requests += requests
            self.bytes_sent += sent

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: WeightServer
    protocol_version = "HTTP/1.1"

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
                self._error(401, "missing or wrong bearer token",
                            {"WWW-Authenticate": 'Bearer realm="astraflow-weights"'})
                return
        path = unquote(urlsplit(self.path).path).removeprefix("/")
        try:
            file = self.server.store.local_path(path)
        except WeightStoreError as e:
            self._error(400, str(e))
            return
        if not file.is_file():
            self._error(404, f"no blob {path!r}")
            return
        size = file.stat().st_size
        start, end = 0, size  # [start, end)
        status = 200
        m = _RANGE.match(self.headers.get("Range", "").strip())
        if m and (m[1] or m[2]):
            if m[1]:
                start = int(m[1])
                end = min(size, int(m[2]) + 1) if m[2] else size
            else:  # suffix range: the last N bytes
                start = max(0, size - int(m[2]))
            if start >= size or start >= end:
                self._error(416, f"range {self.headers['Range']!r} outside {size} bytes",
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
            with open(file, "rb") as f:
                f.seek(start)
                remaining = end - start
                while remaining > 0:
                    chunk = f.read(min(remaining, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.server.count(sent=len(chunk))
                    remaining -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            log.debug("client went away during %s", path)
            self.close_connection = True


def make_server(root: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None) -> WeightServer:
    """A server for the blobs under ``root`` (call ``serve_forever()``; port 0 picks a free one)."""
    root = Path(root)
    if not root.is_dir():
        raise WeightStoreError(f"weight store directory {root} does not exist")
    return WeightServer(root, (host, port), token)


class HttpStore:
    """Client of a weight server: ``HttpStore("http://host:8000", token=...)``. Read-only."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        if urlsplit(base_url).scheme not in ("http", "https"):
            raise WeightStoreError(f"weight server URL {base_url!r} must start with http(s)://")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"HttpStore({self.base_url!r})"

    def _request(self, method: str, path: str, headers: dict[str, str] | None = None
                 ) -> BinaryIO:
        url = f"{self.base_url}/{quote(check_path(path))}"
        req = urllib.request.Request(url, method=method, headers=dict(headers or {}))
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            return cast(BinaryIO, urllib.request.urlopen(req, timeout=self.timeout))
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 404:
                raise BlobNotFoundError(f"blob {path!r} not found at {self.base_url}") from None
            if e.code in (401, 403):
                raise WeightStoreError(f"{self.base_url} refused {path!r} (HTTP {e.code}); "
                                       "pass the server's --token") from None
            raise WeightStoreError(f"{method} {url}: HTTP {e.code} {e.reason}") from None
        except (TimeoutError, urllib.error.URLError, OSError) as e:
            raise WeightStoreError(f"{method} {url}: {e}") from None

    def put(self, path: str, data: bytes | memoryview) -> None:
        raise WeightStoreError(
            f"{self!r} is read-only: the trainer writes blobs to a FileStore and serves that "
            "directory with `astraflow weights serve DIR`")

    def open(self, path: str, offset: int = 0) -> BinaryIO:
        if offset == 0:
            return self._request("GET", path)
        resp = self._request("GET", path, {"Range": f"bytes={offset}-"})
        if getattr(resp, "status", 206) != 206:
            resp.close()
            raise WeightStoreError(f"{self.base_url} ignored a Range request for {path!r}")
        return resp

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if length == 0:
            return b""
        if offset == 0 and length is None:
            headers = {}
        else:
            headers = {"Range": f"bytes={offset}-{'' if length is None else offset + length - 1}"}
        try:
            with self._request("GET", path, headers) as resp:
                return resp.read()
        except WeightStoreError as e:
            if "HTTP 416" in str(e):
                return b""
            raise

    def exists(self, path: str) -> bool:
        try:
            self._request("HEAD", path).close()
        except BlobNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        with self._request("HEAD", path) as resp:
            return int(resp.headers["Content-Length"])  # type: ignore[attr-defined]
