"""Cores shared by the compute roles of one machine: an idle role lends its cores to the busy.

Each role has a *share* and marks itself busy (an ``flock`` on its file in the run's ``cores/``
folder); a role that borrows sets its torch threads before each unit of work to
``max(share, cores − Σ shares of the other busy roles)``. The trainer lends but never borrows,
so its steps stay bit-for-bit reproducible (docs/metrics.md). `astraflow run` turns it on
through :data:`ENV`; :func:`from_env` builds a role's :class:`CoreShare` (None when off)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.core.errors import ConfigError

log = logging.getLogger("astraflow.cores")

#: ``<folder>:<cores>:<share>``: set by `astraflow run` for each role that shares the cores
ENV = "ASTRAFLOW_SHARE_CORES"


@dataclass(frozen=True)
class Peer:
    """Another role sharing the cores: its name, its share and its busy file."""

    name: str
    share: int
    lock: Path


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parse_env(value: str) -> tuple[Path, int, int]:
    """(folder, cores, share) of an :data:`ENV` value; ConfigError naming it when malformed."""
    folder, _, rest = value.rpartition(":")
    folder, _, cores = folder.rpartition(":")
    try:
        n, share = int(cores), int(rest)
    except ValueError:
        n = share = 0
    if not folder or n < 1 or not 1 <= share <= n:
        raise ConfigError(f"{ENV}={value!r}: expected FOLDER:CORES:SHARE with 1 <= SHARE <= "
                          "CORES (set by `astraflow run`; unset it to keep torch's threads)")
    return Path(folder), n, share


class CoreShare:
    """One role's share of the machine's cores (see the module docstring). Lifecycle:
    construct (registers the role), :meth:`busy` around its work, :meth:`adjust` before each
    unit of it, :meth:`close`."""

    def __init__(self, folder: str | Path, name: str, *, cores: int, share: int = 1,
                 borrow: bool = True, every_s: float = 0.05, set_threads: Any = None) -> None:
        if not 1 <= share <= cores:
            raise ConfigError(f"core share {share} of role {name!r} is not in 1..{cores}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.cores = cores
        self.share = share
        self.borrow = borrow  # False: lends its share while idle, keeps its own threads
        self.every_s = every_s
        self._set_threads = set_threads or _torch_threads
        self._lock_path = self.folder / f"{name}.busy"
        self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._depth = 0  # nested busy() sections
        self._mutex = threading.Lock()
        self._peers: list[Peer] = []
        self._peers_at = -1.0
        self._checked_at = -1.0
        self.threads = 0  # what the last adjust() set (0: not yet)
        self.changes = 0  # how often the thread count changed
        info = {"name": name, "share": share, "pid": os.getpid()}
        tmp = self.folder / f".{name}.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.folder / f"{name}.json")

    # -- who else is here --------------------------------------------------------------------
    def peers(self) -> list[Peer]:
        """The other roles registered in the folder (re-read at most once a second)."""
        now = time.monotonic()
        if now - self._peers_at < 1.0:
            return self._peers
        peers = []
        for f in sorted(self.folder.glob("*.json")):
            try:
                info = json.loads(f.read_text())
            except (OSError, ValueError):
                continue  # being written or removed: next time
            name = str(info.get("name", ""))
            if name and name != self.name:
                peers.append(Peer(name, int(info.get("share", 1)), self.folder / f"{name}.busy"))
        self._peers, self._peers_at = peers, now
        return peers

    def busy_peers(self) -> list[Peer]:
        """The other roles computing now (whose busy file is locked)."""
        out = []
        for p in self.peers():
            try:
                fd = os.open(p.lock, os.O_RDONLY)
            except OSError:
                continue  # never busy yet
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                out.append(p)
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        return out

    def want(self) -> int:
        """The threads this role should run on now."""
        taken = sum(p.share for p in self.busy_peers())
        return max(self.share, min(self.cores, self.cores - taken))

    # -- the role's side ---------------------------------------------------------------------
    def enter(self) -> None:
        """Mark this role busy (re-entrant; pair with :meth:`leave`) and set its threads (a
        borrower's)."""
        with self._mutex:
            self._depth += 1
            if self._depth == 1:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.adjust(force=True)

    def leave(self) -> None:
        with self._mutex:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """This role is busy for the block (:meth:`enter` … :meth:`leave`)."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def adjust(self, force: bool = False) -> int:
        """Set the threads to :meth:`want` (at most every ``every_s`` unless ``force``); call it
        on the thread that computes (OpenMP's thread count is per calling thread). A role that
        does not borrow keeps the threads it has (returns 0)."""
        if not self.borrow:
            return self.threads
        now = time.monotonic()
        if not force and now - self._checked_at < self.every_s:
            return self.threads
        self._checked_at = now
        n = self.want()
        # forced (a busy stretch starts, maybe on another thread: the count is per thread),
        # or changed
        if force or n != self.threads:
            if n != self.threads:
                self.changes += 1
            self._set_threads(n)
            self.threads = n
        return n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.folder / f"{self.name}.json").unlink()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def from_env(name: str, env: dict[str, str] | None = None, **kwargs: Any) -> CoreShare | None:
    """The role ``name``'s :class:`CoreShare` when :data:`ENV` is set (by `astraflow run`),
    else None (the role keeps the threads its config gives)."""
    value = (os.environ if env is None else env).get(ENV)
    if not value:
        return None
    folder, cores, share = parse_env(value)
    log.info("sharing cores role=%s cores=%d share=%d folder=%s", name, cores, share, folder)
    return CoreShare(folder, name, cores=cores, share=share, **kwargs)


def env_value(folder: str | Path, cores: int, share: int) -> str:
    """The :data:`ENV` value `astraflow run` gives a role."""
    return f"{folder}:{cores}:{share}"
