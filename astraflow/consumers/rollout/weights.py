"""Following ``weights.<policy>``: a background thread per hosted policy.

When the weights :class:`~astraflow.weights.syncer.Syncer` sees a newer version, the thread
downloads its blobs in the background (:meth:`Syncer.prefetch`), then asks the engine to apply
them at a safe point (:meth:`Engine.update_weights`), where only the local decode-and-apply
happens: the engine never stops for a download, and in-flight episodes go on with the new
weights. ``fetch_s`` and ``apply_s`` are the running totals of the two phases.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import TYPE_CHECKING

from astraflow.consumers.rollout.engines.base import Engine
from astraflow.core.errors import AstraflowError

if TYPE_CHECKING:
    from astraflow.weights.syncer import Syncer

log = logging.getLogger("astraflow.rollout.weights")

#: consecutive polls a sync may be put off for an incomplete prefetch; then it runs anyway
#: (its own download, retries and heals inside the safe point), so a blob that never comes
#: cannot stop a worker from following for good
MAX_PUT_OFF = 5


class WeightFollower:
    """Keeps one engine at the newest published version of one policy."""

    def __init__(self, syncer: Syncer, *, engine: Engine, poll_interval: float = 0.5) -> None:
        if engine.weight_target() is None or syncer.target is not engine.weight_target():
            raise AstraflowError(f"engine {engine.name!r} of policy {syncer.policy!r}: the "
                                 "syncer must apply to the engine's weight_target()")
        self.policy = syncer.policy
        self.engine = engine
        self.poll_interval = poll_interval
        self.syncer = syncer
        self.failures = 0
        self.updates = 0
        # syncs put off because the prefetch did not get every blob (a cut or slow link):
        # the engine is held only once the blobs are local, or after MAX_PUT_OFF tries
        self.put_off = 0
        self._put_off_run = 0
        self.fetch_s = 0.0  # seconds spent downloading ahead (the engine decoding meanwhile)
        self.apply_s = 0.0  # seconds the engine was held for a sync (decode and apply)
        # the newest version seen on weights.<policy> (None: none yet); written by the follower
        # thread, read by the worker's drain (a draining worker judges staleness against it)
        self.newest: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"af-weights-{self.policy}")

    def start(self) -> WeightFollower:
        self._thread.start()
        return self

    def _behind(self) -> bool:
        newest = self.syncer.newest()
        held = self.syncer.version
        if held is not None and self.engine.version != held:
            return True  # synced, but the engine has not taken it (e.g. a server refused it)
        return newest is not None and (held is None or newest > held)

    @property
    def lag(self) -> int:
        """Versions between the newest published and the one the engine holds."""
        if self.newest is None:
            return 0
        return max(0, self.newest - (self.engine.version or 0))

    def sync_now(self, timeout: float = 0.0) -> int | None:
        """Read the topic (waiting up to ``timeout`` for a manifest) and apply what is new;
        returns the version held. Called by the follower thread; tests may call it directly
        while the thread is not started."""
        self.syncer.poll(timeout)
        self.newest = self.syncer.newest()
        if self._behind():
            t0 = time.monotonic()
            self.syncer.prefetch()
            t1 = time.monotonic()
            self.fetch_s += t1 - t0
            if not self.syncer.prefetch_complete and self._put_off_run < MAX_PUT_OFF:
                # not all local yet: syncing now would download inside the safe point, with
                # the engine held; the next poll resumes the download instead
                self.put_off += 1
                self._put_off_run += 1
                log.info("policy=%s sync put off: the prefetch is not complete (%d in a row)",
                         self.policy, self._put_off_run)
                return self.syncer.version
            self._put_off_run = 0
            # the manifests were read above: inside the safe point only local work happens
            self.engine.update_weights(functools.partial(self.syncer.sync_once, read=False))
            self.apply_s += time.monotonic() - t1
            self.updates += 1
            log.info("policy=%s weights now at version=%s", self.policy, self.syncer.version)
        return self.syncer.version

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_now(self.poll_interval)
            except Exception as e:  # noqa: BLE001 - retried at the next poll, counted
                self.failures += 1
                log.warning("weight sync failed policy=%s error=%s", self.policy, e)
                self._stop.wait(self.poll_interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.syncer.close()
