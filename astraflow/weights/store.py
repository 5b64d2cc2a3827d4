"""Weight stores: where blobs live. Manifests on the bus point into a store by relative path.

A store is anything with the :class:`WeightStore` methods: :class:`FileStore` (a directory or
shared mount) and :class:`~astraflow.weights.http.HttpStore` ship here. Every path from a
manifest is checked by :func:`check_path` before it is used. :func:`download` copies a blob to
a local file resumably (through ``<dest>.part``), never past the expected size, and within a
deadline when given one."""

from __future__ import annotations

import contextlib
import errno
import http.client
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from astraflow.core.errors import WeightStoreError
from astraflow.weights.files import NotRegularFileError, fsync_dir, open_regular, write_atomic

log = logging.getLogger("astraflow.weights.store")

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,127}", re.ASCII)  # fullmatch only
MAX_PATH = 512


class BlobNotFoundError(WeightStoreError):
    """The store has no blob at that path."""


class StoreFullError(WeightStoreError):
    """The store has no space left for a blob (ENOSPC or a quota)."""


class UnsafePathError(WeightStoreError):
    """A blob path (from a manifest) was refused: it could reach outside the store."""


class OutsideStoreError(UnsafePathError):
    """A well-formed blob path that resolves outside the store (a symlink leads out)."""


def check_path(path: str) -> str:
    """Return ``path`` if it is a safe relative blob path, else raise WeightStoreError.

    Safe: '/'-separated segments of letters, digits and ``_ . = + -``, none starting with a dot
    (so no ``..``, no hidden or temporary files), no absolute path, no backslash, no empty
    segment, at most 512 characters. Each segment matches the whole pattern (a trailing newline
    or any other control character is refused too)."""
    segments = path.split("/") if isinstance(path, str) else []
    if (not isinstance(path, str) or not path or len(path) > MAX_PATH
            or not all(_SEGMENT.fullmatch(s) for s in segments)):
        raise UnsafePathError(
            f"refused blob path {path!r}: expected a relative path of segments made of letters, "
            "digits and '_.=+-' (not starting with '.'), e.g. 'solver/v0000000042.delta.afw'")
    return path


@runtime_checkable
class WeightStore(Protocol):
    """Blob storage. Paths are relative, '/'-separated and pass :func:`check_path`."""

    def put(self, path: str, data: bytes | memoryview) -> None:
        """Store ``data`` at ``path`` durably and atomically (readers see all of it or none)."""

    def open(self, path: str, offset: int = 0, *, deadline: float | None = None) -> BinaryIO:
        """A readable stream of the blob from byte ``offset`` (close it when done).
        Raises BlobNotFoundError when absent. ``deadline``: a :func:`time.monotonic` time
        after which reading raises WeightStoreError (a remote store; None: its own bound)."""

    def read(self, path: str, offset: int = 0, length: int | None = None, *,
             deadline: float | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of the blob (to its end when length is None)."""

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """The blob's size in bytes; BlobNotFoundError when absent."""

    def delete(self, path: str) -> None:
        """Remove the blob (absent: nothing to do); the publisher's clean-up of a version it
        could not store whole."""


def discard(store: WeightStore, paths: list[str], why: str) -> None:
    """Delete the blobs ``paths`` of a version that will not be published (``why``, for the
    log); a blob that cannot be deleted is logged and left."""
    for path in paths:
        try:
            store.delete(path)
        except (OSError, WeightStoreError) as e:
            log.warning("could not delete blob %r of %s: %s", path, why, e)


class FileStore:
    """Blobs as files under ``root`` (a local disk or a shared mount such as NFS)."""

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root).resolve()
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    def local_path(self, path: str) -> Path:
        """The file of blob ``path`` (checked to stay inside the root, symlinks resolved)."""
        p = (self.root / check_path(path)).resolve()
        if not p.is_relative_to(self.root):
            raise OutsideStoreError(f"refused blob path {path!r}: it resolves outside "
                                    f"{self.root}")
        return p

    def put(self, path: str, data: bytes | memoryview) -> None:
        try:
            write_atomic(self.local_path(path), data, fsync=self.fsync)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(
                    f"weight store {self.root} is full: no space left writing {path!r} "
                    f"({len(data):,} bytes); free space there or point weights.store at a "
                    "larger volume") from e
            raise

    def open(self, path: str, offset: int = 0, *, deadline: float | None = None) -> BinaryIO:
        """The blob's file; only a regular file is a blob (a FIFO or a device in the directory
        is refused at once, never waited on)."""
        try:
            f = open_regular(self.local_path(path))
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {path!r} not found in {self}") from None
        except NotRegularFileError as e:
            raise BlobNotFoundError(f"blob {path!r} in {self} is {e.strerror}") from None
        f.seek(offset)
        return f

    def read(self, path: str, offset: int = 0, length: int | None = None, *,
             deadline: float | None = None) -> bytes:
        with self.open(path, offset) as f:
            return f.read() if length is None else f.read(length)

    def exists(self, path: str) -> bool:
        return self.local_path(path).is_file()

    def delete(self, path: str) -> None:
        self.local_path(path).unlink(missing_ok=True)

    def size(self, path: str) -> int:
        try:
            st = self.local_path(path).stat()
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {path!r} not found in {self}") from None
        if not stat.S_ISREG(st.st_mode):
            raise BlobNotFoundError(f"blob {path!r} in {self} is not a regular file")
        return st.st_size


class TokenBucket:
    """Limits a byte rate: :meth:`take` sleeps until ``n`` bytes fit (burst: a quarter second)."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(rate / 4, 16384))
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


def download(store: WeightStore, path: str, dest: str | Path, *, rate_limit: float | None = None,
             chunk: int = 1 << 16, size: int | None = None, bucket: TokenBucket | None = None,
             deadline_s: float | None = None) -> int:
    """Copy blob ``path`` to the local file ``dest``, resuming from ``dest.part`` if an earlier
    call was interrupted. Returns the bytes transferred by this call. ``rate_limit`` caps the
    transfer in bytes per second (to emulate a slow link). ``size``: the blob's size when the
    caller knows it (a manifest's ``total_bytes``), which saves asking the store — a round
    trip over a far link; the bytes received must then add up to it, and no byte past it is
    read. ``bucket``: a :class:`TokenBucket` shared by concurrent downloads (then one cap for
    all of them). ``deadline_s``: seconds this call may take in all (None: no deadline of its
    own); past it, WeightStoreError, and the ``.part`` is kept for the next call to resume.
    Every failure is a WeightStoreError (BlobNotFoundError when the store lacks the blob)."""
    check_path(path)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    total = store.size(path) if size is None else size
    if total < 0:
        raise WeightStoreError(f"download of {path!r}: size {total} is negative")
    try:
        if dest.exists() and dest.stat().st_size == total:
            return 0
        dest.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > total:  # not a prefix of this blob: start over
            part.unlink()
            have = 0
        if bucket is None and rate_limit:  # else: the caller's, shared by concurrent downloads
            bucket = TokenBucket(rate_limit, burst=min(rate_limit / 4, chunk))
        moved = 0
        if have < total:
            moved = _copy(store, path, part, have, total, chunk, bucket, deadline)
            have = part.stat().st_size
        if have != total:
            raise WeightStoreError(f"download of {path!r} from {store!r} stopped at {have} of "
                                   f"{total} bytes; call again to resume from {part}")
        os.replace(part, dest)
    except OSError as e:  # the local side: the cache directory full or unwritable
        raise WeightStoreError(f"download of {path!r} to {dest}: {e}") from None
    with contextlib.suppress(OSError):
        fsync_dir(dest.parent)
    return moved


def _copy(store: WeightStore, path: str, part: Path, have: int, total: int, chunk: int,
          bucket: TokenBucket | None, deadline: float | None) -> int:
    """Append bytes ``[have, total)`` of blob ``path`` to ``part``; returns how many came (fewer
    when the stream ended early). Never reads past ``total``."""
    moved = 0
    with store.open(path, have, deadline=deadline) as src, open(part, "ab") as out:
        declared = getattr(src, "length", None)  # a remote store's announced length
        if declared is not None and declared != total - have:
            raise WeightStoreError(f"download of {path!r} from {store!r}: the store has "
                                   f"{declared} bytes from offset {have}, expected "
                                   f"{total - have} (a blob of {total} bytes)")
        read = getattr(src, "read1", src.read)  # returns as soon as some bytes are there
        try:
            while have + moved < total:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WeightStoreError("its deadline passed")
                want = min(chunk if bucket is None else min(chunk, int(bucket.burst)),
                           total - have - moved)
                data = read(want)[:want]
                if not data:
                    break
                if bucket is not None:
                    bucket.take(len(data))
                out.write(data)
                moved += len(data)
        except (WeightStoreError, OSError, http.client.HTTPException, ValueError) as e:
            raise WeightStoreError(f"download of {path!r} from {store!r} interrupted at "
                                   f"{have + moved} of {total} bytes ({e}); call again to "
                                   "resume") from None
        finally:
            out.flush()
            os.fsync(out.fileno())
    return moved
