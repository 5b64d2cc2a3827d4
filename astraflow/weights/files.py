"""Durable local files: write to a temporary name, fsync, rename (readers never see a partial
file, a crash leaves only a temporary that the next write replaces); and reading only regular
files, never waiting on whatever else a directory may hold (:func:`open_regular`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power loss (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """Open a temporary file next to ``path``; on a clean exit it is fsynced and renamed to
    ``path``; on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        fsync_dir(path.parent)


def write_atomic(path: Path, chunks: bytes | memoryview | Iterable[bytes | memoryview], *,
                 fsync: bool = True) -> int:
    """Write ``chunks`` to ``path`` atomically; returns the bytes written."""
    if isinstance(chunks, bytes | bytearray | memoryview):
        chunks = [chunks]
    n = 0
    with atomic_file(path, fsync=fsync) as f:
        for c in chunks:
            n += f.write(c)
    return n


class NotRegularFileError(OSError):
    """The path is a FIFO, a socket, a device or a directory, not a regular file."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (not a symlink to one: resolve
    first); anything else raises :class:`NotRegularFileError` at once. Opened non-blocking,
    so a FIFO (whose ``open`` waits for a writer for ever) or a device never holds the caller,
    then checked with ``fstat`` (the file opened is the file checked)."""
    fd = os.open(path, _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegularFileError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
