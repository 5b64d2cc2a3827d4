"""A worker behind a regional mirror: a blob the mirror lacks is waited for while its manifest
is fresh (the mirror is still fetching it), then fetched from the fallback store; a blob the
mirror serves corrupt is caught by the manifest's blob digest before a byte is applied."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from test_weights_sync import POLICY, RUN, evolve, identical, numpy_model

from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget


def publish(bus, store, versions) -> None:
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, background=False,
                    full_every=4)
    for v, t in enumerate(versions):
        pub.publish(t, v)
    pub.close()


def test_a_fresh_blob_missing_on_the_mirror_is_waited_for(bus, store, tmp_path: Path) -> None:
    versions = evolve(numpy_model(), 6)
    publish(bus, store, versions[:3])
    mirror = FileStore(tmp_path / "mirror")
    shutil.copytree(store.root, mirror.root)  # the mirror has 0..2
    publish_more = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None,
                             background=False, full_every=4)
    assert publish_more.resume(versions[2], 2, last_full=0)
    publish_more.publish(versions[3], 3)  # on the trainer's store only, for now
    publish_more.close()
    held = {k: np.zeros_like(v) for k, v in versions[0].items()}
    worker = Syncer(bus, run=RUN, policy=POLICY, store=mirror, fallback=store,
                    target=DictTarget(held), cache_dir=tmp_path / "cache")
    assert worker.sync_once(2) == 2  # 3 is fresh: the mirror will have it soon
    assert worker.stats.fallbacks == 0 and identical(held, versions[2])
    shutil.copytree(store.root, mirror.root, dirs_exist_ok=True)  # the mirror caught up
    assert worker.sync_once() == 3 and worker.stats.fallbacks == 0
    # a mirror that never gets it: past the grace the worker crosses the link itself
    publish_last = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None,
                             background=False, full_every=4)
    assert publish_last.resume(versions[3], 3, last_full=0)
    publish_last.publish(versions[4], 4)
    publish_last.close()
    worker.fallback_grace_s = 0.0
    assert worker.sync_once() == 4 and worker.stats.fallbacks == 1
    assert identical(held, versions[4])


def test_a_corrupt_blob_is_caught_before_anything_is_applied(bus, store, tmp_path: Path) -> None:
    versions = evolve(numpy_model(), 3)
    publish(bus, store, versions)
    held = {k: np.zeros_like(v) for k, v in versions[0].items()}
    worker = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held))
    assert worker.sync_once(2) == 2
    publish_more = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None,
                             background=False, full_every=100)
    assert publish_more.resume(versions[2], 2, last_full=0)
    nxt = {k: v.copy() for k, v in versions[2].items()}
    nxt["embed"][0, :8] ^= 1
    publish_more.publish(nxt, 3)
    publish_more.close()
    (blob,) = [p for p in store.root.rglob("v0000000003.delta.*.afw")]
    data = bytearray(blob.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's payload
    blob.write_bytes(bytes(data))
    before = {k: v.copy() for k, v in held.items()}
    applied = worker.stats.applied
    assert worker.sync_once() == 2  # no route to 3 but the bad delta: it stays at 2, intact
    assert worker.version == 2 and identical(held, before)
    assert worker.stats.heals == 1
    # nothing was half-applied, so nothing had to be rebuilt from the full
    assert worker.stats.applied == applied
