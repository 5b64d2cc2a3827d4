"""The publisher: the trainer's side. Turns a version's tensors into a blob and a manifest.

:meth:`Publisher.publish` copies the tensors to host memory and returns; a background thread
encodes a delta and/or a full snapshot, writes each blob durably to the store, and only then
produces its manifest to ``weights.<policy>``: a manifest on the bus means its blob is there.
When to write a full, a delta, or skip a version is in docs/weights.md#publisher."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from astraflow.core.bus.types import Bus, Message
from astraflow.core.errors import AstraflowError, WeightIntegrityError, WeightStoreError
from astraflow.core.records import AdapterSpec, TensorEntry, WeightManifest, encode
from astraflow.core.stream import Output, send
from astraflow.core.topics import record_key, topic_name
from astraflow.weights.bits import bits_dict, blob_digest, digest
from astraflow.weights.blob import CODEC, Bits, EncodedVersion, check_compatible, encode_version
from astraflow.weights.codec import DEFAULT_LEVEL
from astraflow.weights.follow import decode_manifest, read_new
from astraflow.weights.store import StoreFullError, WeightStore, discard

log = logging.getLogger("astraflow.weights.publisher")


@dataclass
class PublishStats:
    versions: int = 0  # versions published
    coalesced: int = 0  # versions replaced by a newer one before they were encoded
    fulls: int = 0
    deltas: int = 0
    bytes_written: int = 0
    dense_bytes: int = 0  # dense size of the published versions
    skipped_full: int = 0  # versions not published because the store was full
    refreshes: int = 0  # versions published again as a full snapshot (refresh_full)


def manifest_for(enc: EncodedVersion, *, policy: str, uri: str,
                 adapter: AdapterSpec | None = None) -> WeightManifest:
    """The manifest of an encoded blob stored at ``uri``: per tensor its range, its digest
    after applying and (delta) the digest of the base it applies to, so a route is planned on
    content, not on version numbers; and the digest of the whole blob, which a mirror checks
    before serving it."""
    h = enc.header
    return WeightManifest(
        policy=policy, version=h.version, base_version=h.base_version, kind=h.kind, codec=CODEC,
        tensors=[TensorEntry(name=t.name, shape=list(t.shape), dtype=t.dtype, uri=uri,
                             offset=enc.payload_start + t.offset, length=t.length,
                             digest=t.digest, changed=t.changed, base_digest=t.base_digest)
                 for t in h.tensors],
        total_bytes=len(enc.blob), full_bytes=enc.dense_bytes, blob_digest=blob_digest(enc.blob),
        adapter=adapter)


class ManifestTooLargeError(WeightStoreError):
    """A manifest (one entry per tensor) does not fit the bus's record size limit."""


class Publisher:
    """Publishes weight versions of one policy to a store and the bus."""

    def __init__(self, bus: Bus, *, run: str, policy: str, store: WeightStore,
                 full_every: int = 20, max_delta_fraction: float = 0.5,
                 dtype: str | None = "bfloat16", level: int = DEFAULT_LEVEL,
                 background: bool = True, coalesce: bool = True, client_id: str = "",
                 refresh_full_after_s: float | None = None) -> None:
        if full_every < 1:
            raise AstraflowError(f"full_every must be >= 1, got {full_every}")
        if refresh_full_after_s is not None and refresh_full_after_s <= 0:
            raise AstraflowError(f"refresh_full_after_s must be > 0 or None, got "
                                 f"{refresh_full_after_s}")
        self.policy = policy
        self.store = store
        self.full_every = full_every
        self.max_delta_fraction = max_delta_fraction
        self.dtype = dtype
        self.level = level
        self.coalesce = coalesce
        self.refresh_full_after_s = refresh_full_after_s
        self.topic = topic_name(run, "weights", policy)
        self.stats = PublishStats()
        # LoRA: the tensors published are this adapter, not the model (set by the trainer's
        # build when trainer.lora is on); every manifest carries it
        self.adapter: AdapterSpec | None = None
        self.last_manifests: list[WeightManifest] = []
        bus.create_topics({self.topic: 1})
        self._bus = bus
        self._producer = bus.producer(client_id=client_id or f"weights-publisher-{policy}")
        self._base: Bits | None = None
        self._base_version: int | None = None
        self._base_digests: dict[str, str] = {}
        self._last_full: int | None = None
        self._last_version: int | None = None  # newest version handed to publish()
        # when a version was last handed over, or a refresh was last done or declined
        self._last_sent = time.monotonic()
        self._published_at: float | None = None  # when publish() was last called
        self.pace_s: float | None = None  # moving mean of the seconds between versions
        self._pending: tuple[Bits, int] | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"weights-publisher-{policy}")
            self._thread.start()

    # -- the trainer's calls ------------------------------------------------------------------
    def publish(self, tensors: Mapping[str, Any], version: int) -> None:
        """Publish ``tensors`` (name → torch tensor or numpy array) as ``version``. Blocks only
        for the copy; encoding and writing happen in the background. Raises an error that the
        background work met since the last call."""
        self._raise_error()
        if self._last_version is not None and version <= self._last_version:
            raise AstraflowError(f"version {version} is not newer than the last published "
                                 f"version {self._last_version}; versions must increase")
        bits = bits_dict(tensors, copy=True, dtype=self.dtype)
        self._last_version = version
        now = time.monotonic()
        if self._published_at is not None:
            gap = now - self._published_at
            self.pace_s = gap if self.pace_s is None else 0.7 * self.pace_s + 0.3 * gap
        self._published_at = self._last_sent = now
        if self._thread is None:
            self._publish_now(bits, version)
            return
        with self._cond:
            while self._pending is not None and not self.coalesce:
                self._cond.wait()
            if self._pending is not None:
                self.stats.coalesced += 1
                log.info("coalesced version=%d into version=%d", self._pending[1], version)
            self._pending = (bits, version)
            self._cond.notify_all()

    def resume(self, tensors: Mapping[str, Any], version: int, *,
               last_full: int | None = None) -> bool:
        """Continue the chain of a publisher that ran before this one (a restarted trainer):
        ``tensors`` are the weights of ``version`` as the trainer restored them from its
        checkpoint, which that publisher published; the next :meth:`publish` then writes a
        delta against them instead of a full snapshot, so far workers that hold ``version``
        (or any later version that the re-trained steps reproduce bit for bit: the manifests'
        base digests decide) fetch a delta, not a full. ``last_full``: the newest full snapshot
        at or before ``version`` (None: looked up on the topic). Returns False, and changes
        nothing, when there is no such full on the topic (a worker starting from nothing could
        not reach the chain): the next version is then a full. Call before the first
        :meth:`publish`."""
        if self._last_version is not None:
            raise AstraflowError("resume() must come before the first publish()")
        if last_full is None:
            last_full = self._newest_full(version)
            if last_full is None:
                log.info("resume policy=%s version=%d: no full snapshot on %s at or before it; "
                         "the next version is a full", self.policy, version, self.topic)
                return False
        bits = bits_dict(tensors, copy=True, dtype=self.dtype)
        self._base, self._base_version = bits, version
        self._base_digests = {name: digest(b) for name, (_d, b) in bits.items()}
        self._last_full = last_full
        self._last_version = version
        log.info("resume policy=%s version=%d last_full=%d: the next version is a delta",
                 self.policy, version, last_full)
        return True

    def refresh_full(self) -> bool:
        """Publish the newest published version again, as a full snapshot, unless it is one
        already; returns whether it did. For a trainer starved of input: a worker that cannot
        build the newest version (a delta blob on its route corrupt or gone: it heals by
        routing around it, which ends at a full snapshot) produces only data too stale to
        train on until the next full, which a starved trainer never makes. With one worker,
        one corrupted blob stopped a run for good (tests/bench/test_chaos.py). The background
        thread calls it by itself once no version came for :attr:`refresh_after_s`; this
        call runs in the caller's thread, after what is pending is published."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._busy)
            self._busy = True  # the background thread starts nothing meanwhile
        try:
            self._raise_error()
            return self._refresh_now()
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def maybe_refresh(self) -> bool:
        """:meth:`refresh_full` once no version was published for :attr:`refresh_after_s`
        seconds (None: never), for a publisher without a background thread (``background``
        False), whose owner calls this while it waits for input; with the thread, which does
        it by itself, False at once."""
        if self._thread is not None or not self._refresh_due():
            return False
        return self.refresh_full()

    def _refresh_due(self) -> bool:
        wait = self._until_refresh()
        return wait is not None and wait <= 0

    @property
    def refresh_after_s(self) -> float | None:
        """How long without a new version makes a refresh due: ``refresh_full_after_s`` or
        three times the pace of versions, whichever is longer (a trainer whose steps take
        longer than ``refresh_full_after_s`` is not starved, and would otherwise have every
        version published twice)."""
        if self.refresh_full_after_s is None:
            return None
        return max(self.refresh_full_after_s, 3 * (self.pace_s or 0.0))

    def _until_refresh(self) -> float | None:
        """Seconds until the newest version is due to be published again as a full (None:
        never: off, nothing published, or the newest is a full already)."""
        after = self.refresh_after_s
        if after is None or self._base_version is None \
                or self._last_full == self._base_version:
            return None
        return self._last_sent + after - time.monotonic()

    def _refresh_now(self) -> bool:
        bits, version = self._base, self._base_version
        self._last_sent = time.monotonic()
        if bits is None or version is None or self._last_full == version:
            return False
        sent = self._put_and_send([encode_version(bits, version=version, level=self.level)],
                                  version)
        if sent is None:
            return False
        self._last_full = version
        self.stats.fulls += 1
        self.stats.refreshes += 1
        log.warning("published version=%d of policy=%s again as a full snapshot: no new "
                    "version for %.1f s (workers that cannot build it now can)", version,
                    self.policy, self.refresh_after_s)
        return True

    def _newest_full(self, version: int) -> int | None:
        """The newest full manifest on the topic at or before ``version`` (reads it whole)."""
        fulls: list[int] = []

        def take(msg: Message) -> None:
            m = decode_manifest(msg, self.policy)
            if m is not None and m.kind == "full" and m.version <= version:
                fulls.append(m.version)

        reader = self._bus.reader(self.topic, start="earliest",
                                  client_id=f"weights-publisher-{self.policy}-resume")
        try:
            read_new(self._bus, reader, self.topic, take)
        finally:
            reader.close()
        return max(fulls, default=None)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every version handed to :meth:`publish` is on the bus (or was coalesced)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending is None and not self._busy,
                                       timeout):
                raise AstraflowError(f"weights publisher still busy after {timeout} s")
        self._raise_error()

    def _check_fits(self, m: WeightManifest) -> None:
        """Refuse a manifest the bus would refuse, before anything of its version is sent (a
        producer error later would fail every restart of the trainer the same way)."""
        size = len(encode(m)) + len(self.topic) + 256  # key, headers, framing
        limit = self._bus.max_message_bytes
        if size > limit:
            raise ManifestTooLargeError(
                f"the manifest of {self.policy} v{m.version} ({len(m.tensors)} tensors) is "
                f"~{size:,} bytes, over the bus's max_message_bytes={limit:,}; raise "
                "bus.max_message_bytes (and, on Kafka, the broker's message.max.bytes), or "
                "fuse per-expert tensors so that there are fewer of them")

    def close(self) -> None:
        """Publish what is pending, stop the background thread, close the producer."""
        try:
            if self._thread is not None:
                self.flush()
        finally:
            if self._thread is not None:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                self._thread.join()
            self._producer.close()

    # -- background work ----------------------------------------------------------------------
    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _loop(self) -> None:
        """Publish what :meth:`publish` hands over; with ``refresh_full_after_s``, also the
        newest version again as a full once none came for that long (:meth:`refresh_full`),
        so every owner of a publisher gets it, and the encoding stays off the owner's
        thread."""
        def ready() -> bool:
            return not self._busy and (self._pending is not None or self._closed
                                       or self._refresh_due())

        while True:
            with self._cond:
                wait = self._until_refresh()
                self._cond.wait_for(ready, None if wait is None else max(0.0, wait))
                if self._busy:
                    continue  # refresh_full() runs in its caller's thread
                job = self._pending
                if job is None:
                    if self._closed:
                        return
                    if not self._refresh_due():
                        continue
                self._pending = None
                self._busy = True
                self._cond.notify_all()
            try:
                if job is None:
                    self._refresh_now()
                else:
                    self._publish_now(*job)
            except BaseException as e:  # noqa: BLE001 - handed to the trainer's next call
                log.error("publishing version=%d failed: %s",
                          job[1] if job is not None else self._base_version, e)
                self._error = e
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _publish_now(self, bits: Bits, version: int) -> None:
        encs: list[EncodedVersion] = []
        base = self._base
        if base is not None:
            try:
                check_compatible(bits, base)
            except WeightIntegrityError as e:
                log.info("tensor set changed at version=%d (%s): full snapshot", version, e)
                base = None
        full = (base is None or self._last_full is None
                or version - self._last_full >= self.full_every)
        dense = sum(b.nbytes for _d, b in bits.values())
        if base is not None:
            delta = encode_version(bits, version=version, base=base,
                                   base_version=self._base_version,
                                   base_digests=self._base_digests, level=self.level)
            if len(delta.blob) <= self.max_delta_fraction * dense:
                encs.append(delta)
            else:
                full = True
        if full:
            encs.append(encode_version(bits, version=version, level=self.level))
        manifests = self._put_and_send(encs, version)
        if manifests is None:
            return
        self._base, self._base_version = bits, version
        self._base_digests = encs[0].digests
        if full:
            self._last_full = version
            self.stats.fulls += 1
        self.stats.deltas += len(encs) - int(full)
        self.stats.versions += 1
        self.stats.dense_bytes += dense
        log.info("published policy=%s version=%d blobs=%s bytes=%d dense=%d", self.policy,
                 version, [m.kind for m in manifests], sum(m.total_bytes for m in manifests),
                 dense)

    def _put_and_send(self, encs: list[EncodedVersion], version: int
                      ) -> list[WeightManifest] | None:
        """Store the blobs of ``version``, then send their manifests; None when the store is
        full (nothing sent)."""
        manifests = []
        token = uuid.uuid4().hex[:8]  # blob names are never reused, so resumed reads are safe
        uris = [f"{self.policy}/v{version:010d}.{enc.header.kind}.{token}.afw" for enc in encs]
        for enc, uri in zip(encs, uris, strict=True):
            manifests.append(manifest_for(enc, policy=self.policy, uri=uri,
                                          adapter=self.adapter))
            self._check_fits(manifests[-1])  # before any blob of the version is stored
        stored: list[str] = []
        try:
            for enc, uri in zip(encs, uris, strict=True):
                self.store.put(uri, enc.blob)
                stored.append(uri)
                self.stats.bytes_written += len(enc.blob)
        except StoreFullError as e:
            # a counted drop, not a dead trainer: this version is not published (workers keep
            # the one they hold) and the next one is encoded against the last published base,
            # so it goes out once there is room again. Its blobs already stored (a delta
            # before the full that did not fit) go: no manifest will ever name them
            self.stats.skipped_full += 1
            log.error("version=%d not published (%d skipped so far): %s", version,
                      self.stats.skipped_full, e)
            discard(self.store, stored, f"unpublished version={version}")
            return None
        for m in manifests:
            send(self._producer, Output(self.topic, m, record_key("weights", m)))
        self._producer.flush()
        self.last_manifests = manifests
        return manifests
