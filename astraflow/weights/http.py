"""The HTTP weight store's client, :class:`HttpStore` (its server is in
:mod:`astraflow.weights.server`; ``WeightServer`` and ``make_server`` are re-exported here).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import BinaryIO, cast
from urllib.parse import quote, urlsplit

from astraflow.core.errors import WeightStoreError
from astraflow.weights.server import WeightServer, make_server
from astraflow.weights.store import BlobNotFoundError, check_path

__all__ = ["HttpStore", "WeightServer", "make_server"]


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
