"""Forged manifests on ``weights.<policy>``: refused before they are acted on, never allowed
to hide the real manifest of a blob, and never spending the heal budget that protects against
real corruption. The syncer and the mirror alike reach the real newest version."""

from __future__ import annotations

import time

import numpy as np
import pytest
from weights_helpers import mutate

from astraflow.core.bus import Bus
from astraflow.core.records import TensorEntry, WeightManifest, decode
from astraflow.core.stream import Output, send
from astraflow.core.topics import topic_name
from astraflow.weights.follow import manifest_problem
from astraflow.weights.mirror import Mirror
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget

RUN, POLICY = "t", "solver"
TOPIC = topic_name(RUN, "weights", POLICY)


def evolve(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = [{"embed": rng.integers(0, 1 << 16, (64, 32), dtype=np.uint16),
            "norm": rng.standard_normal(32).astype(np.float32)}]
    for _ in range(n - 1):
        out.append({k: mutate(rng, v, 0.02) for k, v in out[-1].items()})
    return out


def publish(bus: Bus, store: FileStore, versions: list[dict]) -> list[WeightManifest]:
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, full_every=3)
    for v, tensors in enumerate(versions):
        pub.publish(tensors, v)
        pub.flush()
    pub.close()
    reader = bus.reader(TOPIC)
    out = [decode(m.value, WeightManifest) for m in reader.consume(500, 5.0)]
    reader.close()
    return out


def forge(bus: Bus, *manifests: WeightManifest) -> None:
    """Produce ``manifests`` on the policy's topic, after the real ones."""
    producer = bus.producer()
    for m in manifests:
        send(producer, Output(TOPIC, m))
    producer.flush()


@pytest.fixture
def history(bus: Bus, store: FileStore) -> tuple[list[dict], list[WeightManifest]]:
    versions = evolve(6)  # fulls 0 and 3, deltas 1..5
    return versions, publish(bus, store, versions)


def same(held: dict, want: dict) -> bool:
    return all(np.asarray(held[k]).tobytes() == want[k].tobytes() for k in want)


def edit(m: WeightManifest, **changes) -> WeightManifest:
    return WeightManifest(**{**{f: getattr(m, f) for f in m.__struct_fields__}, **changes})


def entry(t: TensorEntry, **changes) -> TensorEntry:
    return TensorEntry(**{**{f: getattr(t, f) for f in t.__struct_fields__}, **changes})


def test_a_manifest_without_tensors_is_refused_and_skipped(bus, store, history) -> None:
    versions, manifests = history
    full = next(m for m in manifests if m.kind == "full")
    forge(bus, edit(full, version=99, tensors=[]))
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=target)
    assert syncer.sync_once(5) == 5 and same(target.tensors, versions[5])
    assert syncer.stats.refused == 1 and syncer.newest() == 5


def test_more_forged_manifests_than_max_heals_do_not_stall(bus, store, history) -> None:
    """Manifests naming blobs that do not exist, newer than the real ones: each is tried once,
    none spends the heal budget (max_heals=0 here), and the real newest version is reached."""
    versions, manifests = history
    full = next(m for m in manifests if (m.version, m.kind) == (3, "full"))
    forge(bus, *(edit(full, version=100 + i,
                 tensors=[entry(t, uri=f"{POLICY}/v{100 + i:010d}.full.0000000{i}.afw")
                          for t in full.tensors]) for i in range(6)))
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=target, max_heals=0)
    assert syncer.sync_once(5) == 5 and same(target.tensors, versions[5])
    assert syncer.newest() == 5  # the missing ones are not announced as newer for a while
    assert syncer.sync_once() == 5  # and not asked for again at once


def test_a_forged_fresh_manifest_does_not_hold_a_worker_behind_a_mirror(bus, store, history,
                                                                        tmp_path) -> None:
    """A blob the mirror lacks is waited for while its manifest is fresh; a created_at far in
    the future does not make a forged manifest fresh forever, and while a blob is waited for
    the worker goes as far as the other blobs take it."""
    versions, manifests = history
    full = next(m for m in manifests if (m.version, m.kind) == (3, "full"))
    later = full.created_at + 10**6
    forge(bus, edit(full, version=100, created_at=later,
                    tensors=[entry(t, uri=f"{POLICY}/v0000000100.full.00000000.afw")
                             for t in full.tensors]),
          edit(full, version=101, created_at=time.time(),
               tensors=[entry(t, uri=f"{POLICY}/v0000000101.full.00000000.afw")
                        for t in full.tensors]))
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=FileStore(store.root), fallback=store,
                    target=target)
    assert syncer.sync_once(5) == 5 and same(target.tensors, versions[5])


def test_a_forged_manifest_of_an_existing_blob_does_not_hide_the_real_one(bus, store,
                                                                          history) -> None:
    """Same version, same blob, other digests, published after the real one: the first
    manifest of a blob wins; the conflicting one is refused and counted."""
    versions, manifests = history
    real = next(m for m in manifests if (m.version, m.kind) == (5, "delta"))
    bogus = "blake3:" + "0" * 32
    forge(bus, edit(real, tensors=[entry(t, digest=bogus) for t in real.tensors]))
    held = {k: v.copy() for k, v in versions[4].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store,
                    target=DictTarget(held, version=4))
    assert syncer.sync_once(5) == 5 and same(held, versions[5])
    assert syncer.stats.refused == 1 and syncer.stats.heals == 0


def test_the_mirror_keeps_the_first_manifest_of_a_blob(bus, store, history, tmp_path) -> None:
    versions, manifests = history
    real = next(m for m in manifests if (m.version, m.kind) == (5, "delta"))
    forge(bus, edit(real, blob_digest="blake3:" + "0" * 32),
          edit(real, version=77, tensors=[]))
    mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=store, root=tmp_path / "m",
                    retry_s=0.0)
    assert mirror.mirror_once(timeout=5) == 0
    assert mirror.stats.fetched == len(manifests) and mirror.stats.skipped == 0
    assert (tmp_path / "m" / real.tensors[0].uri).read_bytes() == \
        store.local_path(real.tensors[0].uri).read_bytes()
    assert mirror.stats.refused == 2
    mirror.close()


FORGERIES = {
    "no tensors": {"tensors": []},
    "two blobs": {"tensors": "two-blobs"},
    "unsafe path": {"tensors": "../x.afw"},
    "newline path": {"tensors": "solver/x.afw\n"},
    "negative version": {"version": -1},
    "delta without base": {"base_version": None},
    "base not older": {"base_version": 9},
    "full with a base": {"kind": "full"},
    "other codec": {"codec": "zip"},
    "no bytes": {"total_bytes": 0},
    "range outside the blob": {"total_bytes": 10},
    "duplicate tensor": {"tensors": "dup"},
}


@pytest.mark.parametrize("change", FORGERIES.values(), ids=FORGERIES.keys())
def test_manifest_problems_are_named(history, change) -> None:
    _versions, manifests = history
    real = next(m for m in manifests if (m.version, m.kind) == (5, "delta"))
    assert manifest_problem(real) is None
    t = real.tensors
    if change.get("tensors") == "two-blobs":
        change = {"tensors": [t[0], entry(t[1], uri="solver/other.afw")]}
    elif change.get("tensors") == "dup":
        change = {"tensors": [t[0], t[0]]}
    elif isinstance(change.get("tensors"), str):
        change = {"tensors": [entry(e, uri=change["tensors"]) for e in t]}
    assert manifest_problem(edit(real, **change))


def test_forged_manifests_cost_one_request_each_once(bus, store, history, tmp_path,
                                                     monkeypatch) -> None:
    """100 manifests naming blobs that do not exist, newer than the real ones, served by a
    real weight server: the first sync asks for each forged blob once and reaches the real
    newest version; later polls and prefetches — an hour apart on the syncer's clock, past
    any backoff — never ask for them again (requests counted on the server)."""
    import threading
    from collections import Counter
    from types import SimpleNamespace

    from astraflow.weights import syncer as syncer_module
    from astraflow.weights.http import HttpStore, make_server

    versions, manifests = history
    full = next(m for m in manifests if (m.version, m.kind) == (3, "full"))
    forged = [f"{POLICY}/v{100 + i:010d}.full.{i:08d}.afw" for i in range(100)]
    forge(bus, *(edit(full, version=100 + i, tensors=[entry(t, uri=uri) for t in full.tensors])
                 for i, uri in enumerate(forged)))
    srv = make_server(store.root)
    asked: Counter[str] = Counter()

    class Counting(srv.RequestHandlerClass):  # type: ignore[name-defined,misc]
        def parse_request(self) -> bool:
            ok = super().parse_request()
            if ok:
                asked[self.path.removeprefix("/")] += 1
            return ok

    srv.RequestHandlerClass = Counting
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    clock = [time.monotonic()]
    monkeypatch.setattr(syncer_module, "time", SimpleNamespace(
        time=time.time, monotonic=lambda: clock[0], sleep=time.sleep))
    try:
        target = DictTarget({})
        syncer = Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(srv.url), target=target,
                        cache_dir=tmp_path / "cache", max_heals=0)
        assert syncer.sync_once(5) == 5 and same(target.tensors, versions[5])
        assert [asked[u] for u in forged] == [1] * 100
        assert syncer.stats.missing == 100
        for _ in range(5):
            clock[0] += 3600.0
            syncer.prefetch()
            assert syncer.sync_once() == 5
        assert sum(asked[u] for u in forged) == 100 and syncer.newest() == 5
    finally:
        srv.shutdown()
        srv.server_close()
