"""The syncer: keeps a rollout worker's weights at the newest published version.

It reads every manifest of ``weights.<policy>`` with a group-less reader, plans the cheapest
route from the version its target holds (:func:`~astraflow.weights.route.plan_route`),
fetches and checks each blob, applies it in place and verifies every tensor's digest. A
missing or corrupt blob is routed around (docs/weights.md#syncer).

>>> syncer = Syncer(bus, run="demo", policy="solver", store=HttpStore(url),
...                 target=DictTarget(model_state), cache_dir="/tmp/weights-cache")
>>> syncer.sync_once()          # between generation steps: returns the version now held"""

from __future__ import annotations

import contextlib
import logging
import mmap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from astraflow.core.bus.types import Bus, Message
from astraflow.core.errors import AstraflowError, WeightIntegrityError, WeightStoreError
from astraflow.core.records import WeightManifest
from astraflow.core.topics import topic_name
from astraflow.weights.bits import blob_digest, digest, dtype_info
from astraflow.weights.blob import BaseMismatchError, Blob, parse_blob
from astraflow.weights.follow import BadManifestError, ManifestBook, decode_manifest, read_new
from astraflow.weights.parts import part_key, split_parts, uris_of
from astraflow.weights.route import Route, plan_route
from astraflow.weights.store import (
    BlobNotFoundError,
    TokenBucket,
    UnsafePathError,
    WeightStore,
    check_path,
    download,
)
from astraflow.weights.target import WeightTarget

log = logging.getLogger("astraflow.weights.syncer")

DEFAULT_DEADLINE_S = 60.0  # every download may take this long, plus its size at min_rate
DEFAULT_MIN_RATE = 1_000_000.0  # bytes/s


@dataclass
class SyncStats:
    manifests: int = 0  # manifests read from the topic
    applied: int = 0  # blobs applied
    fetched_bytes: int = 0  # bytes downloaded by this syncer (resumed parts count once)
    heals: int = 0  # routes re-planned after a bad or missing blob
    fallbacks: int = 0  # blobs fetched again from the fallback store (a mirror's bad blob)
    prefetched_bytes: int = 0  # bytes downloaded by prefetch(), ahead of applying
    bad_records: int = 0  # records on the topic that were not manifests of this policy
    refused: int = 0  # manifests refused: malformed, or a second one for a blob already seen
    missing: int = 0  # blobs no store had (a forged manifest, a pruned version): never asked again
    failures: int = 0  # syncs in run() that failed (store unreachable, ...): retried


class Syncer:
    """Follows ``weights.<policy>`` and applies new versions to ``target``."""

    def __init__(self, bus: Bus, *, run: str, policy: str, store: WeightStore,
                 target: WeightTarget, cache_dir: str | Path | None = None,
                 rate_limit: float | None = None, max_heals: int = 3,
                 fallback: WeightStore | None = None, fallback_grace_s: float = 60.0,
                 deadline_s: float = DEFAULT_DEADLINE_S,
                 min_rate: float = DEFAULT_MIN_RATE) -> None:
        if not deadline_s > 0 or not min_rate > 0:
            raise WeightStoreError(f"syncer: deadline_s {deadline_s} and min_rate {min_rate} "
                                   "must be > 0")
        self.policy = policy
        self.store = store
        #: where a blob is fetched again when ``store`` (a regional mirror) lacks it or serves
        #: it corrupt: the trainer's own store, across the far link
        self.fallback = fallback
        self._use_fallback: set[str] = set()  # blobs to fetch from the fallback
        #: a blob the store lacks is waited for this long after its manifest was written
        #: before it is fetched from the fallback (a mirror still fetching it)
        self.fallback_grace_s = fallback_grace_s
        self.prefetch_parallel = 8  # concurrent downloads of one route's blobs
        # one cap for all of this syncer's downloads, concurrent ones included
        self._bucket = (TokenBucket(rate_limit, burst=min(rate_limit / 4, 1 << 16))
                        if rate_limit else None)
        self._lock = threading.Lock()
        self.target = target
        self.rate_limit = rate_limit
        #: corrupt blobs (or wrong bases) met in one sync before it gives up and raises; a
        #: blob that is missing does not count
        self.max_heals = max_heals
        self.deadline_s = deadline_s
        self.min_rate = min_rate
        self.topic = topic_name(run, "weights", policy)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.stats = SyncStats()
        self.prefetch_complete = True  # the last prefetch() got every blob of its route
        self.manifests: list[WeightManifest] = []
        self._book = ManifestBook()
        self._missing: set[str] = set()  # blobs no store had: never asked for again
        self._last_failure = ""
        self._shadow: dict[str, tuple[str, np.ndarray]] = {}  # host bits the target lacks
        self._digests: dict[str, str] | None = None  # of the version held, when known
        self._version = target.current_version()
        self._bus = bus
        bus.create_topics({self.topic: 1})
        self._reader = bus.reader(self.topic, start="earliest",
                                  client_id=f"weights-sync-{policy}")

    # -- the view of the topic ----------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """The version the target holds (None: nothing yet)."""
        return self._version

    def newest(self) -> int | None:
        """The newest version announced, leaving out manifests whose blob was found missing
        everywhere."""
        skip = self._skipped()
        return max((m.version for m in self.manifests if not skip.intersection(uris_of(m))),
                   default=None)

    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> int:
        """Read every manifest on the topic now; when there is none new, wait up to ``timeout``
        seconds for one. Returns how many records were read."""
        got = read_new(self._bus, self._reader, self.topic, self._take, timeout=timeout,
                       max_records=max_records)
        self.stats.manifests += got
        return got

    def _take(self, msg: Message) -> None:
        m = decode_manifest(msg, self.policy)
        if m is None:
            self.stats.bad_records += 1
            return
        try:
            if self._book.admit(m):  # else: a repeat of a manifest already read
                self.manifests.append(m)
        except BadManifestError as e:
            self.stats.refused += 1
            log.warning("policy=%s origin=%s %s", self.policy, msg.origin, e)

    # -- syncing ------------------------------------------------------------------------------
    def plan(self) -> Route | None:
        return plan_route(self.manifests, self._version, current_digests=self._digests,
                          exclude=self._skipped())

    def _skipped(self) -> set[str]:
        """Blobs found missing everywhere: routed around for good."""
        return set(self._missing)

    def _note_missing(self, uris: set[str]) -> None:
        self.stats.missing += len(uris - self._missing)
        self._missing |= uris

    def _deadline_s(self, nbytes: int) -> float:
        """How long a download of ``nbytes`` may take: the floor plus its size at the slowest
        rate expected (``rate_limit`` slows our own reading, so it counts)."""
        rate = min(self.min_rate, self.rate_limit) if self.rate_limit else self.min_rate
        return self.deadline_s + nbytes / rate

    def prefetch(self) -> int:
        """Download the blobs of the route to the newest version into ``cache_dir`` without
        touching the target, so that :meth:`sync_once` then only reads local files: a far
        worker keeps decoding while the next version crosses the link, and its engine stops
        only for the decode-and-apply. Returns the bytes downloaded (0 with a local store or
        no ``cache_dir``, where nothing is downloaded ahead). A failed download is left for
        :meth:`sync_once` to resume or heal; ``prefetch_complete`` is then False, so that a
        caller that holds an engine for the sync can wait for the next prefetch instead of
        downloading inside its safe point."""
        self.prefetch_complete = True
        if self.cache_dir is None:
            return 0
        route = self.plan()
        jobs = {sub.tensors[0].uri: sub.total_bytes
                for m in (route.steps if route is not None else ())
                for sub in split_parts(m) for uri in [sub.tensors[0].uri]
                if getattr(self._store_for(uri), "local_path", None) is None}
        if not jobs:
            return 0
        cache = self.cache_dir
        # the downloads share the link (and the rate limit): each may take as long as all
        deadline_s = self._deadline_s(sum(jobs.values()))

        def get(uri: str) -> int:
            try:
                return download(self._store_for(uri), uri, cache / uri, size=jobs[uri],
                                bucket=self._bucket, deadline_s=deadline_s)
            except WeightStoreError as e:
                log.info("prefetch of %s stopped policy=%s error=%s", uri, self.policy, e)
                if isinstance(e, BlobNotFoundError) and (self.fallback is None
                                                         or uri in self._use_fallback):
                    with self._lock:  # no store left to ask: as sync_once would remember it
                        self._note_missing({uri})
                self.prefetch_complete = False
                return 0

        # the route's blobs at once: over a far link a blob costs a round trip before its
        # first byte, and a worker many versions behind would otherwise pay one per delta
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(len(jobs), self.prefetch_parallel),
                                thread_name_prefix=f"af-prefetch-{self.policy}") as pool:
            moved = sum(pool.map(get, sorted(jobs)))
        with self._lock:
            self.stats.fetched_bytes += moved
            self.stats.prefetched_bytes += moved
        return moved

    def sync_once(self, timeout: float = 0.0, *, read: bool = True) -> int | None:
        """Read new manifests (waiting up to ``timeout``; ``read=False``: plan on the manifests
        already read, as a follower does inside the engine's safe point, where a bus round trip
        would hold the engine), move to the newest reachable version, and return the version
        held."""
        if read:
            self.poll(timeout)
        bad = self._skipped()
        heals = 0  # corrupt blobs and wrong bases met in this call (missing blobs do not count)
        while True:
            route = plan_route(self.manifests, self._version, current_digests=self._digests,
                               exclude=bad)
            if route is None and self._version is not None:
                # nothing newer builds on what we hold: a dead lineage (a trainer restarted
                # from a checkpoint and re-trained to other bytes) whose successor's deltas
                # start below our version. Start over from a full, even an older one, if that
                # reaches further than where we are
                fresh = plan_route(self.manifests, None, exclude=bad)
                if fresh is not None and fresh.version is not None and \
                        fresh.version > self._version:
                    log.warning("policy=%s version=%d: no newer version builds on the weights "
                                "held; starting over from the full of version %d",
                                self.policy, self._version, fresh.steps[0].version)
                    route = fresh
            if route is None:
                return self._version
            try:
                for m in route.steps:
                    self._apply(m)
                return self._version
            except (WeightIntegrityError, BlobNotFoundError, UnsafePathError) as e:
                missing = isinstance(e, BlobNotFoundError)
                if not missing:
                    heals += 1
                self.stats.heals += 1
                uris = {t.uri for t in m.tensors}
                if (missing and self.fallback is not None
                        and not uris <= self._use_fallback
                        and abs(time.time() - m.created_at) < self.fallback_grace_s):
                    # a mirror that has not fetched a fresh version yet: wait for it (the next
                    # sync asks again) rather than fetch it across the far link ourselves, and
                    # meanwhile go as far as the other blobs allow. (A created_at far in the
                    # future, as a forged manifest may carry, is not fresh.)
                    log.info("blob of version=%d not on the mirror yet; waiting", m.version)
                    bad |= uris
                    continue
                if (self.fallback is not None and not isinstance(e, BaseMismatchError)
                        and not uris <= self._use_fallback):
                    # the mirror lacks the blob or served it corrupt: the same route, with
                    # this blob from upstream (the manifest's digests judge both copies)
                    self._drop_cached(uris)
                    self._use_fallback |= uris
                    self.stats.fallbacks += 1
                    log.warning("fetching again from the fallback store policy=%s version=%d "
                                "kind=%s error=%s", self.policy, m.version, m.kind, e)
                    continue
                if not isinstance(e, BaseMismatchError):  # the blob is fine, our base is not
                    bad |= uris
                    self._drop_cached(uris)
                if missing:  # no store has it: routed around, and never asked for again
                    self._note_missing(uris)
                elif heals > self.max_heals:
                    raise
                log.warning("heal policy=%s version=%d kind=%s error=%s", self.policy,
                            m.version, m.kind, e)

    def run(self, max_records: int | None = None, timeout: float | None = None,
            poll_timeout: float = 0.5) -> SyncStats:
        """Follow the topic: stop after ``max_records`` manifests or ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        start = self.stats.manifests
        while True:
            read = self.stats.manifests - start
            if max_records is not None and read >= max_records:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            wait = poll_timeout if deadline is None else min(poll_timeout,
                                                             max(0.0, deadline - time.monotonic()))
            self.poll(wait, None if max_records is None else max_records - read)
            newest = self.newest()
            if newest is not None and (self._version is None or newest > self._version):
                try:
                    self.sync_once()
                except AstraflowError as e:  # a store down or misbehaving, corrupt blobs past
                    # max_heals: counted, and tried again on the next poll
                    self.stats.failures += 1
                    (log.warning if str(e) != self._last_failure else log.debug)(
                        "sync failed policy=%s failures=%d error=%s", self.policy,
                        self.stats.failures, e)
                    self._last_failure = str(e)
        return self.stats

    def close(self) -> None:
        self._reader.close()

    # -- applying one blob --------------------------------------------------------------------
    def _fetch(self, uri: str, size: int | None = None) -> Blob:
        store = self._store_for(uri)
        local = getattr(store, "local_path", None)
        if local is not None:
            path = local(uri)
        else:
            deadline_s = self._deadline_s(size or 0)
            if self.cache_dir is None:
                data = store.read(uri, 0, size, deadline=time.monotonic() + deadline_s)
                self.stats.fetched_bytes += len(data)
                return parse_blob(data, source=uri)
            path = self.cache_dir / uri
            self.stats.fetched_bytes += download(store, uri, path, size=size,
                                                 bucket=self._bucket, deadline_s=deadline_s)
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                buf: bytes | memoryview = (
                    memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size
                    else b"")
        except (FileNotFoundError, IsADirectoryError):
            raise BlobNotFoundError(f"blob {uri!r} not found in {store!r}") from None
        except OSError as e:
            raise WeightStoreError(f"blob {uri!r}: cannot read {path}: {e}") from None
        return parse_blob(buf, source=uri)

    def _store_for(self, uri: str) -> WeightStore:
        return self.fallback if uri in self._use_fallback and self.fallback else self.store

    def _drop_cached(self, uris: set[str]) -> None:
        if self.cache_dir is None:
            return
        locals_ = [getattr(st, "local_path", None) for st in (self.store, self.fallback)]
        for uri in uris:
            try:
                check_path(uri)
            except UnsafePathError:
                continue  # never touch a path a manifest made up
            # never a local store's own copy (a cache_dir pointed at the store's root)
            own = {local(uri).resolve() for local in locals_ if local is not None}
            for p in (self.cache_dir / uri, self.cache_dir / f"{uri}.part"):
                if p.resolve() in own:
                    continue
                with contextlib.suppress(OSError):
                    p.unlink()

    def _bits(self, name: str) -> tuple[str, np.ndarray] | None:
        held = self.target.host_bits(name)
        if held is not None:
            return held
        return self._shadow.get(name)

    def _apply(self, m: WeightManifest) -> None:
        if m.parts:
            self._apply_parts(m)
            return
        uris = {t.uri for t in m.tensors}
        if len(uris) != 1:
            raise WeightIntegrityError(f"manifest of version {m.version} spans {len(uris)} blobs "
                                       "but lists no parts")
        (uri,) = uris
        blob = self._fetch(uri, m.total_bytes)
        check_manifest(m, blob, whole=True)  # a corrupt blob is caught before anything changes
        if m.kind == "delta":
            self._check_base(m, blob)
        self._version = None  # from here until the end the target is half-applied
        for t in blob.header.tensors:
            shape = tuple(t.shape)
            held = self._bits(t.name)
            if t.enc == "delta":
                assert held is not None
                flat = held[1]
            elif held is not None and held[0] == t.dtype and len(held[1]) == t.numel:
                flat = held[1]
            else:
                flat = np.empty(t.numel, dtype=dtype_info(t.dtype).bits)
            if t.enc == "delta" and t.changed == 0:
                continue
            blob.decode_into(t, flat)
            self._put(t.name, t.dtype, shape, flat)
        self._digests = {t.name: t.digest for t in blob.header.tensors}
        self._finish_version(m, uris)

    def _put(self, name: str, dtype: str, shape: tuple[int, ...], flat: np.ndarray) -> None:
        self.target.apply(name, dtype, shape, flat)
        if self.target.host_bits(name) is None:
            self._shadow[name] = (dtype, flat)
        else:
            self._shadow.pop(name, None)

    def _finish_version(self, m: WeightManifest, uris: set[str]) -> None:
        """Every tensor of version ``m`` is in the target: the target finishes the version."""
        self._version = m.version
        if hasattr(self.target, "set_adapter"):  # LoRA: how the adapter applies (weights/adapter.py)
            self.target.set_adapter(m.adapter)
        self.target.finish_version(m.version)
        self.stats.applied += 1
        self._missing -= uris
        self._drop_cached(uris)

    def _apply_parts(self, m: WeightManifest) -> None:
        """Apply a version published from the shards: every part's blob is fetched and checked
        (and, for a delta, every slice's base) before anything changes; then each slice is
        decoded into its rows of the full tensor, in place (dim-0 rows of a C-ordered tensor
        are one contiguous run of words), and each tensor goes to the target once, whole."""
        subs = split_parts(m)
        blobs = []
        for sub in subs:
            blob = self._fetch(sub.tensors[0].uri, sub.total_bytes)
            check_manifest(sub, blob, whole=True)
            blobs.append(blob)
        entries = {(t.uri, t.name): t for t in m.tensors}
        if m.kind == "delta":
            self._check_base_parts(m)
        self._version = None  # from here until the end the target is half-applied
        full: dict[str, np.ndarray] = {}
        touched: set[str] = set()
        for sub, blob in zip(subs, blobs, strict=True):
            for t in blob.header.tensors:
                e = entries[(sub.tensors[0].uri, t.name)]
                if e.name not in full:
                    held = self._bits(e.name)
                    numel = int(np.prod(e.shape, dtype=np.int64))
                    if held is not None and held[0] == e.dtype and len(held[1]) == numel:
                        full[e.name] = held[1]
                    else:  # a full version: every row comes from its parts
                        full[e.name] = np.empty(numel, dtype=dtype_info(e.dtype).bits)
                flat = full[e.name]
                row = int(np.prod(e.shape[1:], dtype=np.int64))
                lo, hi = (e.rows or [0, e.shape[0] if e.shape else 1])
                if t.enc == "delta" and t.changed == 0:
                    continue
                blob.decode_into(t, flat[lo * row:hi * row] if e.shape else flat)
                touched.add(e.name)
        for e in m.tensors:
            if e.name in touched:
                touched.discard(e.name)
                self._put(e.name, e.dtype, tuple(e.shape), full[e.name])
        self._digests = {part_key(t): t.digest for t in m.tensors}
        self._finish_version(m, set(uris_of(m)))

    def _check_base(self, m: WeightManifest, blob: Blob) -> None:
        names = {t.name for t in blob.header.tensors}
        if self._digests is not None and set(self._digests) != names:
            raise WeightIntegrityError(f"delta {m.version} has tensors "
                                       f"{sorted(names ^ set(self._digests))[:3]} that differ "
                                       f"from version {self._version}")
        for t in blob.header.tensors:
            held = self._bits(t.name)
            if held is None or held[0] != t.dtype or len(held[1]) != t.numel:
                raise WeightIntegrityError(
                    f"tensor {t.name!r}: delta {m.version} expects {t.dtype}{t.shape}; the "
                    f"target holds {'nothing' if held is None else held[0]}")
            known = (self._digests or {}).get(t.name) or digest(held[1])
            if known != t.base_digest:
                self._version, self._digests = None, None  # we hold an unknown version
                raise BaseMismatchError(
                    f"tensor {t.name!r}: the held version is not the base of delta {m.version} "
                    f"(digest {known}, expected {t.base_digest})")

    def _check_base_parts(self, m: WeightManifest) -> None:
        keys = {part_key(t) for t in m.tensors}
        if self._digests is not None and set(self._digests) != keys:
            raise BaseMismatchError(f"delta {m.version} has tensor slices "
                                    f"{sorted(keys ^ set(self._digests))[:3]} that differ "
                                    f"from version {self._version}")
        for t in m.tensors:
            held = self._bits(t.name)
            numel = int(np.prod(t.shape, dtype=np.int64))
            if held is None or held[0] != t.dtype or len(held[1]) != numel:
                raise WeightIntegrityError(
                    f"tensor {t.name!r}: delta {m.version} expects {t.dtype}{t.shape}; the "
                    f"target holds {'nothing' if held is None else held[0]}")
            known = (self._digests or {}).get(part_key(t))
            if not known:
                row = int(np.prod(t.shape[1:], dtype=np.int64))
                lo, hi = t.rows or [0, t.shape[0] if t.shape else 1]
                known = digest(held[1][lo * row:hi * row] if t.shape else held[1])
            if known != t.base_digest:
                self._version, self._digests = None, None  # we hold an unknown version
                raise BaseMismatchError(
                    f"tensor {part_key(t)!r}: the held version is not the base of delta "
                    f"{m.version} (digest {known}, expected {t.base_digest})")

def check_manifest(m: WeightManifest, blob: Blob, *, whole: bool = False) -> None:
    """``blob`` is the blob ``m`` names: its header agrees with the manifest, tensor by tensor
    (name, dtype, shape, absolute range, digests, base digests); with ``whole``, its bytes also
    have the manifest's ``blob_digest`` (when it has one) — a check of everything before a
    single byte is decoded into the target."""
    if whole and m.blob_digest and len(blob.buf) != m.total_bytes:
        raise WeightIntegrityError(f"blob {m.tensors[0].uri!r} is {len(blob.buf)} bytes; the "
                                   f"manifest says {m.total_bytes}")
    if whole and m.blob_digest and blob_digest(blob.buf) != m.blob_digest:
        raise WeightIntegrityError(f"blob {m.tensors[0].uri!r}: its digest is not the "
                                   "manifest's blob_digest (corrupt or not this blob)")
    h = blob.header
    if (h.kind, h.version, h.base_version) != (m.kind, m.version, m.base_version):
        raise WeightIntegrityError(
            f"blob {m.tensors[0].uri!r} holds {h.kind} {h.version} (base {h.base_version}); the "
            f"manifest says {m.kind} {m.version} (base {m.base_version})")
    if len(h.tensors) != len(m.tensors):
        raise WeightIntegrityError(f"blob {m.tensors[0].uri!r} has {len(h.tensors)} tensors, the "
                                   f"manifest {len(m.tensors)}")
    for e, t in zip(m.tensors, h.tensors, strict=True):
        if (e.name, e.dtype, list(e.shape), e.offset, e.length, e.digest) != (
                t.name, t.dtype, t.shape, blob.payload_start + t.offset, t.length, t.digest):
            raise WeightIntegrityError(f"tensor {e.name!r}: the manifest and blob "
                                       f"{e.uri!r} disagree on its name, shape, range or digest")
        if e.base_digest and e.base_digest != t.base_digest:  # "": a manifest from before
            raise WeightIntegrityError(f"tensor {e.name!r}: the manifest and blob {e.uri!r} "
                                       "disagree on the base it applies to")
