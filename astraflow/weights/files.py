"""Durable local files: write to a temporary name, fsync, rename (readers never see a partial
file, a crash leaves only a temporary that the next write replaces)."""

from __future__ import annotations

import contextlib
import os
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
