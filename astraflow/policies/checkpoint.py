"""Stage checkpoints: every policy's state, the input offsets it reflects, and the outputs
derived from those inputs (the *outbox*), in one msgpack file replaced atomically.

Outputs are written into the checkpoint before they are produced, so a crash never makes a
restarted stage decide the same inputs differently: on restart the outbox is produced again
(same records, same ids) and processing resumes from the checkpoint's offsets and state. See
docs/policies.md#exactly-resume.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from astraflow.core.stream import OutRecord
from astraflow.policies.base import PolicyError

VERSION = 1


class Checkpoint(msgspec.Struct, kw_only=True):
    v: int = VERSION
    run: str
    stage: str
    policy: str | None = None
    cycle: int = 0
    offsets: dict[str, dict[int, int]] = {}  # topic -> partition -> next offset to read
    versions: dict[str, int] = {}  # trainer version per policy
    states: dict[str, bytes] = {}  # config entry -> msgpack of the policy's state
    outbox: list[OutRecord] = []


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, whole:
    temp file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delivered_path(path: Path) -> Path:
    return path.with_name(path.name + ".delivered")


def mark_delivered(path: Path, cycle: int) -> None:
    """Note that the outbox of checkpoint ``cycle`` was produced and flushed, so a restart
    need not produce it again. Not fsynced: losing the note only costs duplicates."""
    marker = delivered_path(path)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    tmp.write_text(str(cycle))
    os.replace(tmp, marker)


def delivered(path: Path) -> int:
    """The last cycle whose outbox is known to be produced (-1: none)."""
    try:
        return int(delivered_path(path).read_text())
    except (FileNotFoundError, ValueError):
        return -1


def save(path: Path, ckpt: Checkpoint) -> int:
    data = msgspec.msgpack.encode(ckpt)
    write_atomic(path, data)
    return len(data)


def load(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``, or None if there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        ckpt = msgspec.msgpack.decode(data, type=Checkpoint)
    except msgspec.DecodeError as e:
        raise PolicyError(f"checkpoint {path} is unreadable ({e}); move it away to start the "
                          "stage from the bus's committed offsets with fresh state") from None
    if ckpt.v != VERSION:
        raise PolicyError(f"checkpoint {path} has version {ckpt.v}; this build reads "
                          f"{VERSION}")
    return ckpt
