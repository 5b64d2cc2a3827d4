"""Publishing from the shards: two gloo ranks (forked: tests/rank_launcher.py) publish an FSDP2-sharded model, and a
syncer following their manifests holds, version by version, bit for bit what a syncer
following a single-process publisher of the same weights holds; the full/delta choices are
the same too. Shards are uneven (3 rows on 2 ranks) and one rank owns an empty shard."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from rank_launcher import run_ranks

from astraflow.core.bus import connect
from astraflow.core.records import BlobPart, TensorEntry, WeightManifest, decode, encode
from astraflow.weights import DictTarget, FileStore, Publisher, Syncer
from astraflow.weights.bits import bits_dict
from astraflow.weights.follow import manifest_problem
from astraflow.weights.mirror import Mirror
from astraflow.weights.parts import part_key, split_parts

HERE = Path(__file__).parent
VERSIONS = 6


def kinds(manifests: list[WeightManifest]) -> list[tuple[int, str]]:
    return [(m.version, m.kind) for m in manifests]


def follow_one_by_one(syncer: Syncer, count: int) -> dict[int, dict[str, np.ndarray]]:
    """The target's bits after each manifest, read one at a time (so every delta applies)."""
    held = {}
    for _ in range(count):
        assert syncer.poll(timeout=5, max_records=1) == 1, kinds(syncer.manifests)
        v = syncer.sync_once(read=False)
        assert v is not None
        held[v] = {k: b.copy() for k, (_d, b) in
                   ((k, syncer.target.host_bits(k)) for k in syncer.target.tensors)}
    return held


@pytest.mark.slow
def test_sharded_publish_matches_unsharded(tmp_path: Path) -> None:
    sys.path.insert(0, str(HERE))
    import sharded_worker as w

    run_ranks(HERE / "sharded_worker.py", [str(tmp_path), str(VERSIONS)], ranks=2,
              logs=tmp_path / "logs", timeout=300)
    assert "('2.weight', (0, 0))" in (tmp_path / "rows-1.txt").read_text()  # an empty shard
    assert "('1.weight', (2, 1))" in (tmp_path / "rows-1.txt").read_text()  # uneven

    bus = connect(f"embedded://{tmp_path}/bus.db")
    # the same weights through today's single-process publisher
    ref = Publisher(bus, run="t", policy="ref", store=FileStore(tmp_path / "ref"),
                    full_every=w.FULL_EVERY, background=False)
    sent: list[WeightManifest] = []
    for v in range(1, VERSIONS + 1):
        ref.publish(w.weights_of(v), v)
        sent += ref.last_manifests
    ref.close()

    sharded = Syncer(bus, run="t", policy="sharded", store=FileStore(tmp_path / "store"),
                     target=DictTarget(torch=False))
    single = Syncer(bus, run="t", policy="ref", store=FileStore(tmp_path / "ref"),
                    target=DictTarget(torch=False))
    got = follow_one_by_one(sharded, len(sent))
    want = follow_one_by_one(single, len(sent))
    assert kinds(sharded.manifests) == kinds(sent)  # the same full/delta choices
    # full first; a delta too large at 3 (full instead); a scheduled full at 6 (and a delta)
    assert kinds(sent) == [(1, "full"), (2, "delta"), (3, "full"), (4, "delta"), (5, "delta"),
                           (6, "delta"), (6, "full")]
    assert all(m.parts for m in sharded.manifests)
    assert sorted(got) == sorted(want) == list(range(1, VERSIONS + 1))
    for v in want:
        expected = {k: b for k, (_d, b) in bits_dict(w.weights_of(v), dtype="bfloat16").items()}
        assert got[v].keys() == want[v].keys() == expected.keys()
        for name in want[v]:
            assert np.array_equal(got[v][name], want[v][name]), (v, name)
            assert np.array_equal(got[v][name], expected[name].reshape(-1)), (v, name)

    # a fresh worker plans newest full + deltas over the parts' manifests
    fresh = Syncer(bus, run="t", policy="sharded", store=FileStore(tmp_path / "store"),
                   target=DictTarget(torch=False))
    assert fresh.sync_once(timeout=5) == VERSIONS
    for name, bits in want[VERSIONS].items():
        assert np.array_equal(fresh.target.host_bits(name)[1].reshape(-1), bits)

    # a mirror copies every part's blob, and a worker behind it builds the same weights
    mirror = Mirror(bus, run="t", policies=["sharded"], upstream=FileStore(tmp_path / "store"),
                    root=tmp_path / "mirror")
    mirror.mirror_once(timeout=5)
    far = Syncer(bus, run="t", policy="sharded", store=FileStore(tmp_path / "mirror"),
                 target=DictTarget(torch=False))
    assert far.sync_once(timeout=5) == VERSIONS
    for name, bits in want[VERSIONS].items():
        assert np.array_equal(far.target.host_bits(name)[1].reshape(-1), bits)
    for s in (sharded, single, fresh, far):
        s.close()
    mirror.close()
    bus.close()


def _manifest(rows_a: list[int], rows_b: list[int]) -> WeightManifest:
    def entry(uri: str, rows: list[int]) -> TensorEntry:
        return TensorEntry(name="w", shape=[3, 2], dtype="bfloat16", uri=uri, offset=10,
                           length=4, digest="d", rows=rows)

    return WeightManifest(policy="p", version=1, kind="full", codec="afw/1",
                          tensors=[entry("p/a", rows_a), entry("p/b", rows_b)],
                          total_bytes=200, full_bytes=12,
                          parts=[BlobPart(uri="p/a", total_bytes=100),
                                 BlobPart(uri="p/b", total_bytes=100)])


def test_parts_manifest_checks_and_split() -> None:
    good = _manifest([0, 2], [2, 3])
    assert decode(encode(good)) == good
    assert manifest_problem(good) is None, manifest_problem(good)
    assert [part_key(t) for t in good.tensors] == ["w[0:2]", "w[2:3]"]
    a, b = split_parts(good)
    assert (a.tensors[0].shape, b.tensors[0].shape, a.total_bytes) == ([2, 2], [1, 2], 100)
    assert "tile" in (manifest_problem(_manifest([0, 2], [1, 3])) or "")  # overlap
    assert "cover" in (manifest_problem(_manifest([0, 1], [1, 2])) or "")  # short
    assert "rows" in (manifest_problem(_manifest([0, 2], [2, 4])) or "")  # past the end
    # an old manifest (no parts, no rows) reads as before
    old = WeightManifest(policy="p", version=1, kind="full", codec="afw/1", total_bytes=20,
                         full_bytes=12, tensors=[TensorEntry(name="w", shape=[3, 2],
                                                             dtype="bfloat16", uri="p/x",
                                                             offset=10, length=4)])
    assert manifest_problem(old) is None
    assert split_parts(old) == [old]


class ThreadExchange:
    """The ranks' all_gather of bytes for ranks that are threads of one process."""

    def __init__(self, world: int) -> None:
        import threading

        self.slots: list[bytes] = [b""] * world
        self.barrier = threading.Barrier(world)

    def for_rank(self, rank: int):
        def exchange(data: bytes) -> list[bytes]:
            self.slots[rank] = data
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()  # nobody writes the next round's slot before all have read
            return out

        return exchange


def test_three_ranks_in_threads_match_one_publisher(tmp_path: Path) -> None:
    """Without torch.distributed (the exchange is injected): 3 ranks, rows split as FSDP2
    splits them (ceil(n/3) each, the last ones short or empty), numpy shards, fp32 and bf16."""
    import threading

    from astraflow.weights.sharded import Shard, ShardedPublisher

    shapes = {"a": (7, 5), "b": (2, 3), "c": (1,), "d": (9,)}
    dtypes = {"a": np.float32, "b": np.float32, "c": np.float32, "d": np.float16}

    def weights(v: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(100)
        out = {n: r.standard_normal(s).astype(dtypes[n]) for n, s in shapes.items()}
        for step in range(2, v + 1):
            r = np.random.default_rng(step)
            for n in sorted(out):
                mask = r.random(shapes[n]) < 0.2
                out[n] = (out[n] + mask * r.standard_normal(shapes[n])).astype(dtypes[n])
        return out

    world, versions = 3, 5
    bus = connect(f"embedded://{tmp_path}/bus.db")
    ex = ThreadExchange(world)
    pubs = [ShardedPublisher(bus if r == 0 else None, run="t", policy="s",
                             store=FileStore(tmp_path / "s"), rank=r, world_size=world,
                             exchange=ex.for_rank(r), full_every=3, dtype=None,
                             max_delta_fraction=1000.0) for r in range(world)]
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            for v in range(1, versions + 1):
                shards = []
                for n, w in weights(v).items():
                    per = -(-w.shape[0] // world)
                    lo, hi = min(r * per, w.shape[0]), min((r + 1) * per, w.shape[0])
                    shards.append(Shard(n, w[lo:hi], w.shape, lo))
                pubs[r].publish(shards, v)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test's thread
            errors.append(e)
            ex.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    ref = Publisher(bus, run="t", policy="ref", store=FileStore(tmp_path / "r"), full_every=3,
                    dtype=None, max_delta_fraction=1000.0, background=False)
    sent: list[WeightManifest] = []
    for v in range(1, versions + 1):
        ref.publish(weights(v), v)
        sent += ref.last_manifests
    ref.close()
    pubs[0].close()
    assert kinds(sent) == [(1, "full"), (2, "delta"), (3, "delta"), (4, "delta"), (4, "full"),
                           (5, "delta")]
    sharded = Syncer(bus, run="t", policy="s", store=FileStore(tmp_path / "s"),
                     target=DictTarget(torch=False))
    got = follow_one_by_one(sharded, len(sent))
    want = follow_one_by_one(Syncer(bus, run="t", policy="ref", store=FileStore(tmp_path / "r"),
                                    target=DictTarget(torch=False)), len(sent))
    assert sorted(got) == sorted(want) == list(range(1, versions + 1))
    for v in want:
        for name, bits in want[v].items():
            assert np.array_equal(got[v][name], bits), (v, name)
    # "c" has one row: ranks 1 and 2 own none of it; "b": rank 2 owns none
    m = pubs[0].last_manifests[-1]
    assert [t.rows for t in m.tensors if t.name == "c"] == [[]]
    assert sorted(tuple(t.rows) for t in m.tensors if t.name == "b") == [(0, 1), (1, 2)]
    bus.close()
