"""A small file system of its own for a run directory, to fill up on purpose (the chaos
injector's ``disk_full``): a sparse ext4 image, loop-mounted on the directory.

>>> with LoopDisk(Path("runs/chaos/run"), size_mb=4096) as disk:
...     disk.fill()     # every free byte taken by a filler file: writes fail with ENOSPC
...     disk.free()     # the filler removed

Needs root (``mount -o loop``) and ``mkfs.ext4``; :func:`can_mount` says whether this host
can, and why not. The image lives next to the directory (``<dir>.img``) and is removed by
:meth:`close` after unmounting (the directory is left empty: copy out what you keep first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from astraflow.core.errors import AstraflowError

FILLER = ".chaos-filler"


class DiskError(AstraflowError):
    """The quota file system could not be made, mounted or unmounted (with the command's
    output)."""


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DiskError(f"`{' '.join(cmd)}` failed ({proc.returncode}): "
                        f"{(proc.stderr or proc.stdout).strip()}")


def can_mount() -> str | None:
    """None when a loop-mounted ext4 file system can be made here, else the reason."""
    if os.geteuid() != 0:
        return "not root: mounting a loop device needs root"
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        return "mkfs.ext4 or mount is missing (apt-get install e2fsprogs mount)"
    with tempfile.TemporaryDirectory(prefix="af-loop-") as tmp:
        try:
            with LoopDisk(Path(tmp) / "mnt", size_mb=8):
                return None
        except DiskError as e:
            return str(e)


class LoopDisk:
    """A ``size_mb`` ext4 file system (no blocks reserved for root) mounted on ``mountpoint``
    while open. ``fill()`` takes all free space but ``headroom`` bytes; ``free()`` gives it
    back."""

    def __init__(self, mountpoint: Path, *, size_mb: int, headroom: int = 0) -> None:
        self.mountpoint = Path(mountpoint)
        self.image = self.mountpoint.with_name(f"{self.mountpoint.name}.img")
        self.size_mb = size_mb
        self.headroom = headroom
        self.mounted = False

    def open(self) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if any(self.mountpoint.iterdir()):
            raise DiskError(f"{self.mountpoint} is not empty: a quota file system is mounted "
                            "only on an empty directory")
        with self.image.open("wb") as f:
            f.truncate(self.size_mb << 20)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        try:
            _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        except DiskError:
            self.image.unlink(missing_ok=True)
            raise
        self.mounted = True
        (self.mountpoint / "lost+found").rmdir()

    def available(self) -> int:
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Take every free byte but ``headroom`` with a filler file; returns its size."""
        path = self.mountpoint / FILLER
        size = max(0, self.available() - self.headroom)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError:  # a little less than statvfs said: take what there is
                os.ftruncate(fd, 0)
                os.posix_fallocate(fd, 0, max(0, size - (4 << 20)))
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free(self) -> None:
        (self.mountpoint / FILLER).unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            self.free()
            proc = subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
            if proc.returncode != 0:  # a process still holds a file there
                _run("umount", "-l", str(self.mountpoint))
            self.mounted = False
        self.image.unlink(missing_ok=True)

    def __enter__(self) -> LoopDisk:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
