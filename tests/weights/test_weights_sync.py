"""Publisher → bus + store → syncer: every worker ends bit-identical to the trainer."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from weights_helpers import mutate

from astraflow.core.bus import Bus
from astraflow.core.errors import AstraflowError, WeightIntegrityError
from astraflow.core.records import WeightManifest
from astraflow.core.stream import Output, send
from astraflow.core.topics import topic_name
from astraflow.weights.http import HttpStore, WeightServer, make_server
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget

RUN, POLICY = "t", "solver"


def evolve(model: dict, n: int, seed: int = 0, fraction: float = 0.01) -> list[dict]:
    """n versions of a numpy model, each a small step from the one before."""
    rng = np.random.default_rng(seed)
    out = [{k: v.copy() for k, v in model.items()}]
    for _ in range(n - 1):
        out.append({k: mutate(rng, v, fraction) for k, v in out[-1].items()})
    return out


def numpy_model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.integers(0, 1 << 16, (300, 64), dtype=np.uint16),  # bf16 bits
        "norm": rng.standard_normal(64).astype(np.float32),
        "head": rng.standard_normal((8, 9)).astype(np.float16),
        "scale": np.array(1.5, np.float32),
        "empty": np.zeros((0, 3), np.uint16),
    }


def identical(got: dict, want: dict) -> bool:
    return got.keys() >= want.keys() and all(
        np.asarray(got[k]).shape == want[k].shape
        and np.asarray(got[k]).tobytes() == want[k].tobytes() for k in want)


def publish_all(bus: Bus, store, versions: list[dict], **kw) -> Publisher:
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, **kw)
    for v, tensors in enumerate(versions):
        pub.publish(tensors, v)
        pub.flush()
    return pub


@pytest.fixture
def history(bus: Bus, store: FileStore) -> list[dict]:
    versions = evolve(numpy_model(), 45)
    publish_all(bus, store, versions, full_every=20).close()
    return versions


def test_syncers_from_0_and_v_minus_1_and_v_minus_30_end_identical(bus, store, history) -> None:
    newest = len(history) - 1
    for start in (None, 0, newest - 1, newest - 30):
        held = {} if start is None else {k: v.copy() for k, v in history[start].items()}
        target = DictTarget(held, version=start)
        syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=target)
        assert syncer.sync_once(timeout=5) == newest
        assert identical(target.tensors, history[newest]), start
        assert target.current_version() == newest
        syncer.close()


def test_syncers_read_without_a_consumer_group(bus, store, history, tmp_path) -> None:
    import sqlite3

    syncers = [Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget({}))
               for _ in range(2)]
    for syncer in syncers:  # each sees every manifest: nothing is shared or committed
        assert syncer.sync_once(timeout=5) == len(history) - 1
        assert syncer.stats.manifests == bus.describe_topic(
            topic_name(RUN, "weights", POLICY)).end_offsets[0]
        syncer.close()
    conn = sqlite3.connect(tmp_path / "bus.db")
    for table in ("group_members", "group_owners", "group_offsets", "group_state"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    conn.close()


def test_routes_are_cheapest(bus, store, history) -> None:
    newest = len(history) - 1
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget({}, version=43))
    syncer.poll(5)
    assert [(m.version, m.kind) for m in syncer.plan().steps] == [(44, "delta")]
    syncer._version = None
    assert [m.kind for m in syncer.plan().steps] == ["full"] + ["delta"] * (newest - 40)
    fulls = {m.version for m in syncer.manifests if m.kind == "full"}
    assert fulls == {0, 20, 40}
    deltas = {m.version for m in syncer.manifests if m.kind == "delta"}
    assert deltas == set(range(1, 45))  # deltas across full points too
    syncer.close()


def test_in_place_on_torch_cpu_tensors(bus, store) -> None:
    torch = pytest.importorskip("torch")
    base = {"w": torch.randn(64, 32).to(torch.bfloat16), "b": torch.randn(32)}
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None)
    pub.publish(base, 0)
    pub.flush()
    held = {k: v.clone() for k, v in base.items()}
    ptrs = {k: v.data_ptr() for k, v in held.items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held, version=0))
    syncer.poll(5)
    new = {"w": (base["w"].float() + 1e-2).to(torch.bfloat16), "b": base["b"] * 1.001}
    pub.publish(new, 1)
    pub.flush()
    assert syncer.sync_once(timeout=5) == 1
    assert {k: v.data_ptr() for k, v in held.items()} == ptrs  # written in place
    for k in new:
        assert torch.equal(held[k].view(torch.int16 if k == "w" else torch.int32),
                           new[k].view(torch.int16 if k == "w" else torch.int32))
    pub.close()
    syncer.close()


def test_publisher_casts_fp32_master_weights_to_bf16(bus, store) -> None:
    torch = pytest.importorskip("torch")
    master = {"w": torch.randn(50, 50)}
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store)  # dtype bfloat16 by default
    pub.publish(master, 0)
    pub.flush()
    target = DictTarget({}, torch=True)
    Syncer(bus, run=RUN, policy=POLICY, store=store, target=target).sync_once(timeout=5)
    assert target.tensors["w"].dtype == torch.bfloat16
    assert torch.equal(target.tensors["w"].view(torch.int16),
                       master["w"].to(torch.bfloat16).view(torch.int16))
    pub.close()


def test_publish_copies_before_returning(bus, store) -> None:
    w = {"w": np.arange(1000, dtype=np.float32)}
    want = w["w"].copy()
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None)
    pub.publish(w, 0)
    w["w"][:] = -1  # the trainer's next optimizer step
    pub.close()
    target = DictTarget({})
    Syncer(bus, run=RUN, policy=POLICY, store=store, target=target).sync_once(timeout=5)
    assert target.tensors["w"].tobytes() == want.tobytes()


def test_publisher_decides_full_or_delta(bus, store) -> None:
    rng = np.random.default_rng(0)
    w = {"w": rng.integers(0, 1 << 16, 10_000, dtype=np.uint16)}
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, full_every=3,
                    background=False)
    kinds = []
    for v, tensors in enumerate([w, {"w": mutate(rng, w["w"], 0.01)},
                                 {"w": rng.integers(0, 1 << 16, 10_000, dtype=np.uint16)},
                                 {"w": np.zeros(5000, np.uint16)}, {"w": np.zeros(5000, np.uint16)},
                                 {"w": np.ones(5000, np.uint16)},
                                 {"w": mutate(rng, np.ones(5000, np.uint16), 0.01)}]):
        pub.publish(tensors, v)
        kinds.append(sorted(m.kind for m in pub.last_manifests))
    assert kinds == [
        ["full"],  # first version
        ["delta"],
        ["full"],  # everything changed: a delta would not be smaller
        ["full"],  # the tensor's shape changed
        ["delta"],  # nothing changed
        ["delta"],  # everything changed by +1: compresses to almost nothing
        ["delta", "full"],  # 3 versions after the last full: both
    ]
    with pytest.raises(AstraflowError, match="not newer"):
        pub.publish(w, 6)
    m = pub.last_manifests[0]
    assert m.full_bytes == 10_000 and m.tensors[0].uri.startswith("solver/v0000000006.")
    pub.close()


def test_coalesced_versions_still_converge(bus, store) -> None:
    versions = evolve(numpy_model(), 30, seed=3)
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None)
    for v, tensors in enumerate(versions):
        pub.publish(tensors, v)  # no flush: the encoder falls behind and coalesces
    pub.close()
    assert pub.stats.versions + pub.stats.coalesced == 30
    target = DictTarget({})
    assert Syncer(bus, run=RUN, policy=POLICY, store=store, target=target).sync_once(5) == 29
    assert identical(target.tensors, versions[-1])


class EngineTarget:
    """An engine that keeps weights off the host: the syncer must keep a shadow copy."""

    def __init__(self) -> None:
        self.weights: dict[str, bytes] = {}
        self.applied: list[tuple[int | None, str]] = []
        self.version: int | None = None

    def current_version(self) -> int | None:
        return self.version

    def host_bits(self, name: str) -> None:
        return None

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        self.weights[name] = bits.tobytes()
        self.applied.append((self.version, name))

    def finish_version(self, version: int) -> None:
        self.version = version


def test_engine_target_gets_only_changed_tensors(bus, store) -> None:
    v0 = numpy_model()
    v1 = {k: v.copy() for k, v in v0.items()}
    v1["norm"][3] += 1
    publish_all(bus, store, [v0, v1]).close()
    engine = EngineTarget()
    assert Syncer(bus, run=RUN, policy=POLICY, store=store, target=engine).sync_once(5) == 1
    assert engine.weights["norm"] == v1["norm"].tobytes()
    assert engine.weights["embed"] == v0["embed"].tobytes()


@pytest.mark.parametrize("which", ["first", "last"])
def test_corrupt_delta_heals_through_a_full(bus, store, history, which) -> None:
    """A bad delta 39 met at 37: the route is planned again without it (full 40 + deltas).
    Corrupting the last tensor leaves the target half-applied: it heals from nothing."""
    delta = next(m for m in _manifests(bus) if m.version == 39 and m.kind == "delta")
    entries = [t for t in delta.tensors if t.length > 0]
    entry = entries[0] if which == "first" else entries[-1]
    path = store.local_path(entry.uri)
    data = bytearray(path.read_bytes())
    data[entry.offset + entry.length // 2] ^= 0x10
    path.write_bytes(bytes(data))
    held = {k: v.copy() for k, v in history[37].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held, version=37))
    assert syncer.sync_once(5) == len(history) - 1
    assert syncer.stats.heals == 1
    assert identical(held, history[-1])


def held_below_corrupt_newest(bus, store, history: list[dict]
                              ) -> tuple[WeightManifest, dict, Syncer]:
    """Corrupt the newest version's delta (its only blob) and sync a worker holding the
    version before: (that delta, the worker's weights, its syncer)."""
    newest = len(history) - 1
    delta = next(m for m in _manifests(bus) if m.version == newest and m.kind == "delta")
    path = store.local_path(delta.tensors[0].uri)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    held = {k: v.copy() for k, v in history[newest - 1].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store,
                    target=DictTarget(held, version=newest - 1))
    assert syncer.sync_once(5) == newest - 1
    return delta, held, syncer


def test_corrupt_newest_delta_waits_for_the_next_full(bus, store, history) -> None:
    """The newest version exists only as that delta: the worker stays at the version before
    (consistent, verified) instead of applying bad bits."""
    _, held, syncer = held_below_corrupt_newest(bus, store, history)
    assert syncer.stats.heals == 1 and identical(held, history[-2])


def test_a_starved_publisher_publishes_the_newest_again_as_a_full(bus, store,
                                                                  monkeypatch) -> None:
    """The worker held back by a corrupt newest delta (above) gets past it once the publisher,
    with no new version for ``refresh_full_after_s``, publishes that version again as a full
    snapshot: else a starved trainer (the worker's data too stale to train on) never makes
    the next full. Once per version; never before the time; never when the newest is a full."""
    versions = evolve(numpy_model(), 25)
    # without the background thread (which does it by itself: the next test), its owner
    # calls maybe_refresh(), here on a clock of the test's
    pub = publish_all(bus, store, versions, full_every=20, refresh_full_after_s=30.0,
                      background=False)
    newest = len(versions) - 1  # 24: a delta on top of the full 20
    delta, held, syncer = held_below_corrupt_newest(bus, store, versions)  # held back

    assert not pub.maybe_refresh()  # not starved yet
    clock = [1000.0]
    monkeypatch.setattr("astraflow.weights.publisher.time.monotonic", lambda: clock[0])
    # the publisher's times on the test's clock only: a time taken from the real clock
    # (the publishes above) against the fake one would make a pace of the machine's uptime
    pub._last_sent = pub._published_at = clock[0]
    clock[0] += 29.0
    assert not pub.maybe_refresh()
    clock[0] += 2.0
    assert pub.maybe_refresh() and pub.stats.refreshes == 1
    fulls = [m for m in _manifests(bus) if m.version == newest and m.kind == "full"]
    assert len(fulls) == 1 and fulls[0].tensors[0].uri != delta.tensors[0].uri
    clock[0] += 100.0
    assert not pub.maybe_refresh() and pub.stats.refreshes == 1  # once per version

    assert syncer.sync_once(5) == newest and identical(held, versions[newest])
    pub.publish(versions[0], newest + 1)  # a new version: starved again later, refreshed again
    pub.flush()
    after = pub.refresh_after_s  # 3x the pace of versions (131 s since the last) by now
    assert after is not None and after > 30.0
    clock[0] += after - 1.0
    assert not pub.maybe_refresh()
    clock[0] += 2.0
    assert pub.maybe_refresh() and pub.stats.refreshes == 2
    pub.close()


def test_a_slow_trainer_is_not_taken_for_a_starved_one(bus, store, monkeypatch) -> None:
    """A trainer whose steps take longer than ``refresh_full_after_s`` is not starved: the
    refresh waits three times the pace of versions, else every version would go out twice."""
    clock = [1000.0]
    monkeypatch.setattr("astraflow.weights.publisher.time.monotonic", lambda: clock[0])
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, full_every=20,
                    refresh_full_after_s=30.0, background=False)
    assert pub.refresh_after_s == 30.0 and pub.pace_s is None
    for v, tensors in enumerate(evolve(numpy_model(), 4)):
        pub.publish(tensors, v)
        clock[0] += 100.0  # a 100 s step
    assert pub.pace_s == pytest.approx(100.0) and pub.refresh_after_s == pytest.approx(300.0)
    assert not pub.maybe_refresh()  # 100 s since the last version: one step, not starvation
    clock[0] += 199.0
    assert not pub.maybe_refresh()
    clock[0] += 2.0
    assert pub.maybe_refresh() and pub.stats.refreshes == 1
    pub.close()


def test_the_background_thread_refreshes_by_itself_once_per_version(bus, store) -> None:
    """With its background thread (the default), a publisher left without a new version for
    ``refresh_full_after_s`` publishes the newest again as a full with no call from its owner
    (a worker held below a corrupt delta gets past it), once per version; a new version starts
    the time again. maybe_refresh() leaves it to the thread."""
    versions = evolve(numpy_model(), 25)
    pub = publish_all(bus, store, versions, full_every=20, refresh_full_after_s=0.5)
    newest = len(versions) - 1
    _, held, syncer = held_below_corrupt_newest(bus, store, versions)
    assert not pub.maybe_refresh()
    deadline = time.monotonic() + 10
    while pub.stats.refreshes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pub.stats.refreshes == 1
    assert syncer.sync_once(5) == newest and identical(held, versions[newest])
    time.sleep(1.2)  # more than twice the time: still once for this version
    assert pub.stats.refreshes == 1
    pub.publish(versions[0], newest + 1)
    while pub.stats.refreshes == 1 and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    assert pub.stats.refreshes == 2
    assert [m.kind for m in _manifests(bus) if m.version == newest + 1] == ["delta", "full"]
    pub.close()
    assert pub.stats.refreshes == 2


def test_no_refresh_when_the_newest_is_a_full_or_none_was_published(bus, store) -> None:
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None,
                    refresh_full_after_s=1e-9)
    assert not pub.refresh_full() and not pub.maybe_refresh()  # nothing published yet
    pub.publish(numpy_model(), 0)  # the first version is a full
    pub.flush()
    assert not pub.refresh_full() and pub.stats.refreshes == 0
    assert [m.kind for m in _manifests(bus)] == ["full"]
    pub.close()
    with pytest.raises(AstraflowError, match="refresh_full_after_s"):
        Publisher(bus, run=RUN, policy=POLICY, store=store, refresh_full_after_s=0)


def test_missing_blob_heals(bus, store, history) -> None:
    gone = next(m for m in _manifests(bus) if m.version == 30 and m.kind == "delta")
    store.local_path(gone.tensors[0].uri).unlink()
    held = {k: v.copy() for k, v in history[25].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held, version=25))
    assert syncer.sync_once(5) == len(history) - 1
    assert syncer.stats.heals == 1
    assert identical(held, history[-1])


def test_wrong_base_is_detected_and_healed(bus, store, history) -> None:
    held = {k: v.copy() for k, v in history[40].items()}
    held["norm"][0] += 1  # the worker claims version 40 but holds something else
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held, version=40))
    assert syncer.sync_once(5) == len(history) - 1
    assert syncer.stats.heals == 1 and identical(held, history[-1])


def test_traversal_in_a_manifest_is_refused(bus, store, history, tmp_path: Path) -> None:
    (tmp_path / "secret.afw").write_bytes(b"AFWB")
    good = next(m for m in _manifests(bus) if m.version == 44 and m.kind == "delta")
    forged = WeightManifest(**{f: getattr(good, f) for f in good.__struct_fields__
                               if f not in ("version", "base_version", "tensors")},
                            version=45, base_version=44,
                            tensors=[type(t)(**{**_fields(t), "uri": "../secret.afw"})
                                     for t in good.tensors])
    producer = bus.producer()
    send(producer, Output(topic_name(RUN, "weights", POLICY), forged))
    producer.flush()
    held = {k: v.copy() for k, v in history[44].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held, version=44))
    assert syncer.sync_once(5) == 44  # refused as it is read, nothing else to reach
    assert syncer.stats.refused == 1 and syncer.stats.heals == 0
    assert identical(held, history[44])
    assert (tmp_path / "secret.afw").exists()


def test_integrity_failures_stop_after_max_heals(bus, store) -> None:
    versions = evolve(numpy_model(), 2)
    publish_all(bus, store, versions).close()
    for m in _manifests(bus):
        p = store.local_path(m.tensors[0].uri)
        data = bytearray(p.read_bytes())
        data[-1] ^= 0xFF
        p.write_bytes(bytes(data))
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget({}),
                    max_heals=0)
    with pytest.raises(WeightIntegrityError):
        syncer.sync_once(5)


@pytest.fixture
def http_server(store: FileStore) -> Iterator[WeightServer]:
    store.root.mkdir(parents=True, exist_ok=True)
    srv = make_server(store.root)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_sync_over_http_with_cache(bus, store, history, http_server, tmp_path: Path) -> None:
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(http_server.url), target=target,
                    cache_dir=tmp_path / "cache", rate_limit=50e6)
    stats = syncer.run(max_records=len(_manifests(bus)), timeout=30)
    assert syncer.version == len(history) - 1 and identical(target.tensors, history[-1])
    assert stats.fetched_bytes > 0
    assert not list((tmp_path / "cache").rglob("*.afw"))  # applied blobs are not kept


def _fields(s) -> dict:
    return {f: getattr(s, f) for f in s.__struct_fields__}


def _manifests(bus: Bus) -> list[WeightManifest]:
    from astraflow.core.records import decode

    topic = topic_name(RUN, "weights", POLICY)
    end = bus.describe_topic(topic).end_offsets.get(0, 0)
    c = bus.consumer("test-reader", [topic])
    out: list[WeightManifest] = []
    while len(out) < end:
        out += [decode(m.value, WeightManifest) for m in c.consume(500, 5.0)]
    c.close()
    return out


@pytest.mark.gpu
def test_cuda_tensors_publish_and_sync_in_place(bus, store) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    master = {"w": torch.randn(256, 128, device="cuda"), "n": torch.ones(128, device="cuda")}
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store)  # casts to bf16 on the device
    pub.publish(master, 0)
    pub.flush()
    held = {k: torch.zeros_like(v, dtype=torch.bfloat16) for k, v in master.items()}
    ptrs = {k: v.data_ptr() for k, v in held.items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=DictTarget(held))
    assert syncer.sync_once(timeout=5) == 0
    master["w"] += 1e-2
    pub.publish(master, 1)
    pub.close()
    assert syncer.sync_once(timeout=5) == 1
    assert {k: v.data_ptr() for k, v in held.items()} == ptrs  # copied into the same memory
    for k, v in master.items():
        assert torch.equal(held[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16))


def test_background_errors_reach_the_trainer(bus, tmp_path: Path) -> None:
    from astraflow.core.errors import WeightStoreError

    class FullDisk(FileStore):
        def put(self, path: str, data) -> None:  # type: ignore[no-untyped-def]
            raise WeightStoreError("disk full")

    pub = Publisher(bus, run=RUN, policy=POLICY, store=FullDisk(tmp_path), dtype=None)
    pub.publish({"w": np.zeros(10, np.float32)}, 0)
    with pytest.raises(WeightStoreError, match="disk full"):
        pub.flush()
    assert bus.describe_topic(topic_name(RUN, "weights", POLICY)).end_offsets.get(0, 0) == 0
    pub.close()


def test_prefetch_gets_the_route_in_one_go_without_asking_sizes(bus, store, history, http_server,
                                                               tmp_path: Path) -> None:
    """Far behind over HTTP: prefetch asks for each blob of the route once (a GET, no HEAD: the
    manifest gives the size, and a HEAD is a round trip over a far link), all at once; the sync
    after it asks the server for nothing."""
    held = {k: v.copy() for k, v in history[30].items()}
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(http_server.url),
                    target=DictTarget(held, version=30), cache_dir=tmp_path / "cache",
                    rate_limit=50e6)
    syncer.poll(2)
    route = syncer.plan()
    assert route is not None and len(route.steps) == len(history) - 1 - 30
    before = http_server.requests
    assert syncer.prefetch() == route.bytes
    assert http_server.requests - before == len(route.steps)
    assert syncer.version == 30 and identical(held, history[30])  # the target is untouched
    before = http_server.requests
    assert syncer.sync_once() == len(history) - 1 and identical(held, history[-1])
    assert http_server.requests == before
    assert syncer.stats.fetched_bytes == syncer.stats.prefetched_bytes == route.bytes


def test_a_manifest_over_the_bus_limit_is_a_clear_error_before_any_blob(tmp_path) -> None:
    """One entry per tensor: a model of many tensors (per-expert weights of a large MoE) can
    outgrow the bus's record limit; the publisher says so, with the fix, and stores nothing
    of that version (the producer's error would come later, on every restart the same)."""
    from astraflow.core.bus import connect
    from astraflow.weights.publisher import ManifestTooLargeError

    small = connect(f"embedded://{tmp_path}/bus.db", max_message_bytes=20_000)
    store = FileStore(tmp_path / "store")
    many = {f"model.layers.{i}.mlp.experts.{j}.w": np.ones(4, np.float32)
            for i in range(10) for j in range(20)}
    pub = Publisher(small, run=RUN, policy=POLICY, store=store, dtype=None, background=False)
    with pytest.raises(ManifestTooLargeError, match="200 tensors.*raise bus.max_message_bytes"):
        pub.publish(many, 0)
    assert not list((tmp_path / "store").rglob("*.afw"))
    pub.publish({k: v for k, v in list(many.items())[:10]}, 1)  # a small one still goes
    assert len(list((tmp_path / "store").rglob("*.afw"))) == 1
    pub.close()
    small.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs root: skipped where mounting is refused), unmounted after."""
    import subprocess

    root = tmp_path / "store"
    root.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (mount -t tmpfs); this host refuses it")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)


def fill(root: Path, leave: int = 0) -> Path:
    """Take every byte left on ``root``'s file system but ``leave``; the filler file."""
    filler = root / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    if leave:
        os.truncate(filler, filler.stat().st_size - leave)
    return filler


def test_a_full_store_skips_versions_counted_and_the_chain_goes_on(bus, tiny_disk) -> None:
    """A store with no space left (a real 1 MiB tmpfs, filled): the version is not published
    and counted, the trainer's publisher keeps going, and once there is room the next version
    goes out against the last published base, so syncers stay exact."""
    root = tiny_disk
    store = FileStore(root)
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal(60_000).astype(np.float32)}  # ~240 KB a full
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None,
                    background=False, full_every=100)
    pub.publish(w, 1)
    filler = fill(root)
    w["w"] = w["w"] + 1.0  # a dense change: the delta needs room too
    pub.publish(w, 2)
    assert pub.stats.skipped_full == 1 and pub.stats.versions == 1
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp left
    filler.unlink()
    w["w"][:10] += 1.0
    pub.publish(w, 3)
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=store, target=target)
    assert syncer.sync_once(timeout=5) == 3
    assert np.array_equal(target.tensors["w"], w["w"])
    pub.close()


def test_a_version_the_store_cannot_hold_whole_leaves_none_of_its_blobs(bus, tiny_disk) -> None:
    """At a full boundary a version is a delta and a full; on a real tmpfs with room for the
    small delta only, the version is not published and its delta is deleted too (no manifest
    will ever name it: a stray blob of a version nobody can read)."""
    root = tiny_disk
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal(60_000).astype(np.float32)}  # ~240 KB a full
    pub = Publisher(bus, run=RUN, policy=POLICY, store=FileStore(root), dtype=None,
                    background=False, full_every=1)
    pub.publish(w, 1)
    fill(root, leave=64 << 10)  # room for a small delta
    w["w"][:10] += 1.0
    pub.publish(w, 2)  # a delta (fits) and a full (does not)
    assert pub.stats.skipped_full == 1 and pub.stats.versions == 1
    blobs = sorted(p.name for p in (root / POLICY).iterdir())
    assert [b for b in blobs if b.startswith("v0000000002")] == [], blobs
    assert len(blobs) == 1 and blobs[0].startswith("v0000000001.full"), blobs
    pub.close()
