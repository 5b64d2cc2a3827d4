"""The regional mirror: fetches each weight version once across the far link and serves a
region's workers, so the trainer's egress does not grow with the number of remote workers.

A :class:`Mirror` follows ``weights.<policy>`` like a syncer, downloads each new blob from the
upstream store, verifies it against its manifest and only then makes it visible; a restarted
mirror resumes. :func:`serve_mirror` serves the directory, holding a request for a blob still
being fetched. Details: docs/weights.md#regional-mirror.

>>> mirror = Mirror(bus, run="demo", policies=["solver"], upstream=HttpStore(trainer_url),
...                 root="/data/mirror")
>>> threading.Thread(target=mirror.run, daemon=True).start()
>>> serve_mirror(mirror, host="0.0.0.0", port=8470).serve_forever()"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from astraflow.core.bus.types import Bus, Message, Reader
from astraflow.core.errors import WeightIntegrityError, WeightStoreError
from astraflow.core.records import WeightManifest
from astraflow.core.topics import topic_name
from astraflow.weights.bits import Hasher
from astraflow.weights.blob import MAX_HEADER, PREFIX_SIZE, Blob, payload_size, read_header
from astraflow.weights.files import fsync_dir
from astraflow.weights.follow import BadManifestError, ManifestBook, decode_manifest, read_new
from astraflow.weights.http import WeightServer, make_server
from astraflow.weights.parts import split_parts
from astraflow.weights.store import (
    BlobNotFoundError,
    FileStore,
    UnsafePathError,
    WeightStore,
    download,
)
from astraflow.weights.syncer import DEFAULT_DEADLINE_S, DEFAULT_MIN_RATE, check_manifest

log = logging.getLogger("astraflow.weights.mirror")
_CHUNK = 4 << 20


@dataclass
class MirrorStats:
    manifests: int = 0  # manifests read from the topics
    fetched: int = 0  # blobs downloaded from upstream, verified and renamed into the directory
    fetched_bytes: int = 0  # bytes moved from upstream (an interrupted part counts once)
    present: int = 0  # blobs found complete and verified in the directory (a restart)
    verify_failures: int = 0  # downloaded or found blobs that failed verification (deleted)
    skipped: int = 0  # blobs given up: max_attempts failed verifications, or a refused path
    upstream_errors: int = 0  # fetches the upstream failed (unreachable, 404): retried later
    pruned: int = 0  # blobs deleted by keep_versions
    bad_records: int = 0  # records on the topics that were not manifests of their policy
    refused: int = 0  # manifests refused: malformed, or a second one for a blob already seen


class _UpstreamDown(Exception):
    """The upstream failed in a way that will fail the other blobs too: end this pass."""


def blob_file_digest(path: Path) -> str:
    """The blob digest (as :func:`~astraflow.weights.bits.blob_digest` computes it) of a
    file, read in chunks."""
    h = Hasher()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(np.frombuffer(view[:n], dtype=np.uint8))
    return h.hexdigest()


def verify_blob(path: Path, m: WeightManifest) -> None:
    """Raise WeightIntegrityError unless the file at ``path`` is the blob ``m`` describes: its
    size is the manifest's ``total_bytes`` and its digest is ``blob_digest``; for a manifest
    without a blob digest, its header matches the manifest's kind, versions and tensor entries
    and the file holds every byte the header's ranges need (the payload is checked by the
    tensor digests when a worker applies it)."""
    uri = m.tensors[0].uri if m.tensors else "?"
    size = path.stat().st_size
    if m.blob_digest:
        if size != m.total_bytes:
            raise WeightIntegrityError(f"blob {uri!r}: {size} bytes, the manifest of version "
                                       f"{m.version} says {m.total_bytes}")
        got = blob_file_digest(path)
        if got != m.blob_digest:
            raise WeightIntegrityError(f"blob {uri!r}: digest {got}, the manifest of version "
                                       f"{m.version} says {m.blob_digest}")
        return
    with open(path, "rb") as f:
        head = f.read(PREFIX_SIZE)
        hlen = int.from_bytes(head[8:12], "little") if len(head) == PREFIX_SIZE else 0
        head += f.read(min(hlen, MAX_HEADER))
    header, start = read_header(head, source=uri)
    if size < start + payload_size(header):
        raise WeightIntegrityError(f"blob {uri!r}: truncated: {size} bytes, the header needs "
                                   f"{start + payload_size(header)}")
    check_manifest(m, Blob(header, head, start))


class Mirror:
    """Follows ``weights.<policy>`` of ``policies`` and copies every blob from ``upstream`` into
    the directory ``root`` (a FileStore root, served to the region's workers).

    ``rate_limit`` caps upstream downloads (bytes/s). ``max_attempts``: downloads of one blob
    that may fail verification before it is skipped. ``keep_versions``: keep the blobs of the
    newest K versions and of every version from the newest full on (a worker starting from
    nothing always finds its route); older ones are deleted and not fetched (None: keep all).
    Upstream errors are retried after ``retry_s`` seconds, doubling up to ``max_retry_s``.
    A download may take ``deadline_s`` plus its size at ``min_rate`` (or ``rate_limit``)."""

    def __init__(self, bus: Bus, *, run: str, policies: Iterable[str], upstream: WeightStore,
                 root: str | Path, rate_limit: float | None = None, max_attempts: int = 3,
                 keep_versions: int | None = None, retry_s: float = 1.0,
                 max_retry_s: float = 30.0, deadline_s: float = DEFAULT_DEADLINE_S,
                 min_rate: float = DEFAULT_MIN_RATE) -> None:
        if keep_versions is not None and keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1 (or None: keep all), got "
                             f"{keep_versions}")
        self.upstream = upstream
        Path(root).mkdir(parents=True, exist_ok=True)
        self.store = FileStore(root)
        self.rate_limit = rate_limit
        self.max_attempts = max(1, max_attempts)
        self.keep_versions = keep_versions
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.deadline_s = deadline_s
        self.min_rate = min(min_rate, rate_limit) if rate_limit else min_rate
        self._book = ManifestBook()
        self.stats = MirrorStats()
        self._bus = bus
        self._policies = {topic_name(run, "weights", p): p for p in dict.fromkeys(policies)}
        if not self._policies:
            raise ValueError("a mirror needs at least one policy")
        bus.create_topics(dict.fromkeys(self._policies, 1))
        self._readers: dict[str, Reader] = {
            t: bus.reader(t, start="earliest", client_id=f"weights-mirror-{p}")
            for t, p in self._policies.items()}
        self._pending: dict[str, WeightManifest] = {}  # uri → manifest, blob not mirrored yet
        self._done: dict[str, tuple[str, int]] = {}  # uri → (policy, version), verified here
        self._skipped: set[str] = set()
        self._failures: dict[str, int] = {}  # uri → failed verifications
        self._retry: dict[str, tuple[int, float]] = {}  # uri → (upstream errors, next try)
        self._newest: dict[str, int] = {}  # policy → newest version seen
        self._newest_full: dict[str, int] = {}  # policy → newest full version seen
        self._stop = threading.Event()
        self._changed = threading.Condition()  # a blob mirrored or given up; a poll done
        self._polls = 0

    # -- the view of the topics ---------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> int:
        """Read every manifest on the topics now; when there is none new, wait up to
        ``timeout`` seconds for one. Returns how many records were read."""
        got = sum(self._drain(t, r, 0.0) for t, r in self._readers.items())
        if not got and timeout > 0:
            share = timeout / len(self._readers)
            for t, r in self._readers.items():
                got += self._drain(t, r, share)
                if got:
                    break
        with self._changed:
            self._polls += 1
            self._changed.notify_all()
        return got

    def _drain(self, topic: str, reader: Reader, timeout: float) -> int:
        policy = self._policies[topic]
        got = read_new(self._bus, reader, topic, lambda msg: self._take(policy, msg),
                       timeout=timeout)
        self.stats.manifests += got
        return got

    def _take(self, policy: str, msg: Message) -> None:
        m = decode_manifest(msg, policy)
        if m is None:
            self.stats.bad_records += 1
            return
        try:
            if not self._book.admit(m):
                return  # a repeat of a manifest already read
        except BadManifestError as e:
            self.stats.refused += 1
            log.warning("policy=%s origin=%s %s", policy, msg.origin, e)
            return
        self._newest[policy] = max(self._newest.get(policy, m.version), m.version)
        if m.kind == "full":
            self._newest_full[policy] = max(self._newest_full.get(policy, m.version), m.version)
        for part in split_parts(m):  # a version published from the shards: blob by blob
            uri = part.tensors[0].uri
            if uri not in self._done and uri not in self._skipped:
                self._pending[uri] = part

    # -- mirroring ----------------------------------------------------------------------------
    def mirror_once(self, timeout: float = 0.0) -> int:
        """Read new manifests (waiting up to ``timeout``), fetch every blob not mirrored yet
        (except those waiting out an upstream error), prune; returns the blobs now pending."""
        self.poll(timeout)
        floors = self._floors()
        now = time.monotonic()
        for uri, m in sorted(self._pending.items(), key=lambda e: self._order(e[1])):
            if self._stop.is_set():
                break
            floor = floors.get(m.policy)
            if floor is not None and m.version < floor:
                del self._pending[uri]  # older than what is kept: never fetched
                self._delete(uri, m.policy, m.version)  # left by an earlier run
                continue
            if self._retry.get(uri, (0, 0.0))[1] > now:
                continue
            try:
                self._mirror(uri, m)
            except _UpstreamDown:
                break
        self._prune(floors)
        return len(self._pending)

    def run(self, max_records: int | None = None, timeout: float | None = None,
            poll_timeout: float = 0.5) -> MirrorStats:
        """Follow the topics and mirror: stop once ``max_records`` manifests were read and
        their blobs handled, after ``timeout`` seconds, or when :meth:`stop` is called."""
        deadline = None if timeout is None else time.monotonic() + timeout
        start = self.stats.manifests
        while not self._stop.is_set():
            wait = poll_timeout if deadline is None else min(
                poll_timeout, max(0.0, deadline - time.monotonic()))
            self.mirror_once(wait)
            if max_records is not None and self.stats.manifests - start >= max_records:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        return self.stats

    def stop(self) -> None:
        """Make :meth:`run` return (from another thread) after the blob in flight."""
        self._stop.set()

    def close(self) -> None:
        for r in self._readers.values():
            r.close()

    def wait_for(self, uri: str, timeout: float) -> bool:
        """Wait until blob ``uri`` is mirrored (True); False at once when it was given up,
        after two polls of the bus that did not announce it (no such blob), or after
        ``timeout`` seconds (still being fetched). For the weight server's request threads
        while :meth:`run` is following the bus in another thread."""
        deadline = time.monotonic() + timeout
        with self._changed:
            polls = self._polls
            while True:
                if uri in self._done:
                    return True
                if uri in self._skipped or (uri not in self._pending
                                            and self._polls >= polls + 2):
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)

    @property
    def pending(self) -> int:
        """Blobs known from manifests and not mirrored yet (skipped ones excluded)."""
        return len(self._pending)

    def _order(self, m: WeightManifest) -> tuple[int, int]:
        """What a worker starting from nothing needs comes first (the newest full and the
        deltas after it, oldest first), then the rest, newest first."""
        full = self._newest_full.get(m.policy)
        if full is not None and m.version >= full:
            return (0, m.version)
        return (1, -m.version)

    def _mirror(self, uri: str, m: WeightManifest) -> None:
        try:
            final = self.store.local_path(uri)
        except UnsafePathError as e:
            self._give_up(uri, m, e)
            return
        if final.is_file():  # from an earlier run: verified once, then trusted
            try:
                verify_blob(final, m)
            except (WeightIntegrityError, OSError) as e:
                self.stats.verify_failures += 1
                log.warning("corrupt blob in the mirror, fetching again policy=%s version=%d "
                            "kind=%s error=%s", m.policy, m.version, m.kind, e)
                with contextlib.suppress(OSError):
                    final.unlink()
            else:
                self._finish(uri, m)
                self.stats.present += 1
                return
        # hidden: the weight server refuses names starting with '.', so it is never served
        stage = final.with_name(f".{final.name}.mirror")
        part = stage.with_name(stage.name + ".part")
        while True:
            before = part.stat().st_size if part.exists() else 0
            try:
                self.stats.fetched_bytes += download(
                    self.upstream, uri, stage, rate_limit=self.rate_limit, size=m.total_bytes,
                    deadline_s=self.deadline_s + m.total_bytes / self.min_rate)
            except WeightStoreError as e:
                after = part.stat().st_size if part.exists() else 0
                self.stats.fetched_bytes += max(0, after - before)
                self._upstream_failed(uri, m, e)
                if isinstance(e, BlobNotFoundError):
                    return  # this blob only; try the others
                raise _UpstreamDown from None
            try:
                verify_blob(stage, m)
            except (WeightIntegrityError, OSError) as e:
                self.stats.verify_failures += 1
                for p in (stage, part):
                    with contextlib.suppress(OSError):
                        p.unlink()
                self._failures[uri] = n = self._failures.get(uri, 0) + 1
                if n >= self.max_attempts:
                    self._give_up(uri, m, e)
                    return
                log.warning("downloaded blob failed verification, fetching again policy=%s "
                            "version=%d kind=%s attempt=%d error=%s", m.policy, m.version,
                            m.kind, n, e)
                continue
            os.replace(stage, final)
            fsync_dir(final.parent)
            self._finish(uri, m)
            self.stats.fetched += 1
            log.info("mirrored policy=%s version=%d kind=%s bytes=%d", m.policy, m.version,
                     m.kind, m.total_bytes)
            return

    def _finish(self, uri: str, m: WeightManifest) -> None:
        with self._changed:
            self._pending.pop(uri, None)
            self._retry.pop(uri, None)
            self._done[uri] = (m.policy, m.version)
            self._changed.notify_all()

    def _give_up(self, uri: str, m: WeightManifest, e: Exception) -> None:
        with self._changed:
            self._pending.pop(uri, None)
            self._skipped.add(uri)
            self._changed.notify_all()
        self.stats.skipped += 1
        log.error("skipped blob policy=%s version=%d kind=%s uri=%r error=%s (workers fetch "
                  "it from their fallback store, or route around it)", m.policy, m.version,
                  m.kind, uri, e)

    def _upstream_failed(self, uri: str, m: WeightManifest, e: Exception) -> None:
        self.stats.upstream_errors += 1
        n = self._retry.get(uri, (0, 0.0))[0] + 1
        delay = min(self.max_retry_s, self.retry_s * 2 ** (n - 1))
        self._retry[uri] = (n, time.monotonic() + delay)
        (log.warning if n == 1 else log.debug)(
            "upstream fetch failed policy=%s version=%d kind=%s retry_in=%.1fs error=%s",
            m.policy, m.version, m.kind, delay, e)

    # -- pruning ------------------------------------------------------------------------------
    def _floors(self) -> dict[str, int]:
        """policy → the oldest version kept (only with keep_versions and a full seen)."""
        if self.keep_versions is None:
            return {}
        return {p: min(newest - self.keep_versions + 1, self._newest_full[p])
                for p, newest in self._newest.items() if p in self._newest_full}

    def _prune(self, floors: dict[str, int]) -> None:
        for uri, (policy, version) in list(self._done.items()):
            floor = floors.get(policy)
            if floor is not None and version < floor:
                del self._done[uri]
                self._delete(uri, policy, version)

    def _delete(self, uri: str, policy: str, version: int) -> None:
        try:
            path = self.store.local_path(uri)
            path.unlink()
        except (OSError, UnsafePathError):
            return
        self.stats.pruned += 1
        log.info("pruned policy=%s version=%d uri=%r", policy, version, uri)


class _HoldingStore:
    """What the mirror's weight server reads through: a request for a blob that the mirror is
    still fetching waits for it instead of being answered 404 at once. Workers see a manifest
    on the bus when the mirror does; without this, one that asks first would fall back to the
    trainer's store and cross the far link itself."""

    def __init__(self, mirror: Mirror, hold_s: float) -> None:
        self.root = mirror.store.root
        self._mirror = mirror
        self._hold_s = hold_s

    def local_path(self, path: str) -> Path:
        file = self._mirror.store.local_path(path)  # checks the path first
        if self._hold_s > 0 and not file.is_file():
            self._mirror.wait_for(path, self._hold_s)
        return file


def serve_mirror(mirror: Mirror, *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, hold_s: float = 20.0, **limits: Any) -> WeightServer:
    """The weight server (:func:`~astraflow.weights.http.make_server`) over the mirror's
    directory, where a request for a blob being mirrored waits up to ``hold_s`` seconds for it
    (keep it under the workers' HTTP timeout, 30 s) before the answer is 404 and the worker
    takes it from its fallback store. ``limits``: ``max_connections``, ``idle_timeout_s``,
    ``max_unauthenticated``, ``auth_timeout_s`` of :func:`~astraflow.weights.server.make_server`.
    Call ``serve_forever()`` or ``handle_request()``."""
    server = make_server(mirror.store.root, host=host, port=port, token=token, **limits)
    # the server reads blobs through ``store.local_path`` only
    server.store = cast(FileStore, _HoldingStore(mirror, hold_s))
    return server
