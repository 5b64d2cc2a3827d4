"""A restarted trainer's publisher continues the delta chain, and workers take a delta only
from the bytes it was made against (the manifests' base digests), with real publishers,
syncers, a file store and the embedded bus."""

from __future__ import annotations

import numpy as np
from test_weights_sync import POLICY, RUN, evolve, identical, numpy_model

from astraflow.core.records import WeightManifest, decode
from astraflow.core.topics import topic_name
from astraflow.weights.publisher import Publisher, blob_digest
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget


def manifests(bus) -> list[WeightManifest]:
    reader = bus.reader(topic_name(RUN, "weights", POLICY), start="earliest", client_id="t")
    out = [decode(m.value, WeightManifest) for m in reader.consume(10_000, 1.0)]
    reader.close()
    return out


class Counting(Syncer):
    """A syncer that records which blobs it fetched."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.fetched: list[str] = []

    def _fetch(self, uri, size=None):  # type: ignore[no-untyped-def]
        self.fetched.append(uri)
        return super()._fetch(uri, size)


def publisher(bus, store, **kw) -> Publisher:
    return Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, background=False,
                     **kw)


def test_manifests_name_the_base_and_the_blob(bus, store) -> None:
    versions = evolve(numpy_model(), 4)
    pub = publisher(bus, store, full_every=20)
    for v, t in enumerate(versions):
        pub.publish(t, v)
    pub.close()
    ms = manifests(bus)
    assert [m.kind for m in ms] == ["full", "delta", "delta", "delta"]
    for prev, m in zip(ms, ms[1:], strict=False):
        assert [t.base_digest for t in m.tensors] == [t.digest for t in prev.tensors]
    assert all(t.base_digest == "" for t in ms[0].tensors)
    for m in ms:
        assert m.blob_digest == blob_digest(store.read(m.tensors[0].uri))


def test_a_resumed_publisher_continues_with_a_delta(bus, store) -> None:
    versions = evolve(numpy_model(), 16, seed=3)
    pub = publisher(bus, store, full_every=5)
    for v in range(13):  # published 0..12, then "died"; its checkpoint was at 10
        pub.publish(versions[v], v)
    pub.close()
    held = {k: np.zeros_like(v) for k, v in versions[0].items()}
    worker = Counting(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held))
    assert worker.sync_once(2) == 12  # a worker holding the dead trainer's 12
    resumed = publisher(bus, store, full_every=5)
    assert resumed.resume(versions[10], 10)  # found the full at 10 on the topic
    for v in range(11, 16):
        resumed.publish(versions[v], v)
    resumed.close()
    new = manifests(bus)[-6:]  # 11, 12, 13, 14, 15 (+ the full at 15)
    assert [(m.version, m.kind) for m in new] == [(11, "delta"), (12, "delta"), (13, "delta"),
                                                  (14, "delta"), (15, "delta"), (15, "full")]
    # re-training reproduced 11 and 12 bit for bit (deterministic, as on CPU): the worker
    # takes the restarted trainer's deltas 13, 14, 15 and fetches no full
    worker.fetched.clear()
    assert worker.sync_once(2) == 15
    assert identical(held, versions[15]) and len(worker.fetched) == 3, worker.fetched
    assert not any(".full." in u for u in worker.fetched)


def test_without_a_full_on_the_topic_resume_declines(bus, store) -> None:
    versions = evolve(numpy_model(), 3)
    pub = publisher(bus, store)
    assert not pub.resume(versions[1], 1)
    pub.publish(versions[2], 2)
    pub.close()
    assert [m.kind for m in manifests(bus)] == ["full"]


def diverged_restart(bus, store, *, seed: int, new_seed: int, full_every: int,
                     new_full_every: int) -> tuple[Counting, dict, list[dict], list[dict]]:
    """A trainer published 0..12 (a worker synced to 12), died, and a trainer restarted from
    its checkpoint at 10 re-trained to other bytes and published 11..15. Returns the worker,
    what it holds, the dead lineage's versions and the new ones (new[i] is version 10 + i)."""
    old = evolve(numpy_model(), 13, seed=seed)
    pub = publisher(bus, store, full_every=full_every)
    for v, t in enumerate(old):
        pub.publish(t, v)
    pub.close()
    held = {k: np.zeros_like(v) for k, v in old[0].items()}
    worker = Counting(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held))
    assert worker.sync_once(2) == 12 and identical(held, old[12])
    new = [old[10]] + evolve({k: v.copy() for k, v in old[10].items()}, 6, seed=new_seed)[1:]
    assert not identical(new[2], old[12])
    resumed = publisher(bus, store, full_every=new_full_every)
    assert resumed.resume(new[0], 10)
    for i, v in enumerate(range(11, 16), start=1):
        resumed.publish(new[i], v)
    resumed.close()
    worker.fetched.clear()
    return worker, held, old, new


def test_a_delta_against_other_bytes_is_never_fetched(bus, store) -> None:
    """The restarted trainer re-trained differently (another seed, a GPU): its 11 and 12 are
    not the dead trainer's. A worker at the dead trainer's 12 goes through the new full at 15
    and never fetches the new deltas 13-15, whose base it does not hold."""
    worker, held, _old, new = diverged_restart(bus, store, seed=4, new_seed=9, full_every=5,
                                               new_full_every=5)
    assert worker.sync_once(2) == 15
    assert identical(held, new[5])
    assert len(worker.fetched) == 1 and ".full." in worker.fetched[0], worker.fetched
    assert worker.stats.heals == 0  # planned right, not healed after a fetch


def test_a_worker_on_a_dead_lineage_starts_over_from_an_older_full(bus, store) -> None:
    """The restarted trainer re-trained to other bytes and has published no full since its
    checkpoint: nothing newer builds on the dead trainer's 12 the worker holds. It goes back
    to the full at 10 (older than what it holds) and takes the new chain to the newest."""
    worker, held, _old, new = diverged_restart(bus, store, seed=5, new_seed=11, full_every=10,
                                               new_full_every=100)
    assert worker.sync_once(2) == 15 and identical(held, new[5])
    assert ".full." in worker.fetched[0] and "v0000000010" in worker.fetched[0]
    assert len(worker.fetched) == 6  # the full at 10, then the new 11..15
