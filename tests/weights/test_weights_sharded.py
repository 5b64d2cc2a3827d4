"""Publishing from the shards: two gloo ranks (torchrun) publish an FSDP2-sharded model, and a
syncer following their manifests holds, version by version, bit for bit what a syncer
following a single-process publisher of the same weights holds; the full/delta choices are
the same too. Shards are uneven (3 rows on 2 ranks) and one rank owns an empty shard."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astraflow.core.bus import connect
from astraflow.core.records import BlobPart, TensorEntry, WeightManifest, decode, encode
from astraflow.weights import DictTarget, FileStore, Publisher, Syncer
from astraflow.weights.bits import bits_dict
from astraflow.weights.follow import manifest_problem
from astraflow.weights.mirror import Mirror
from astraflow.weights.parts import part_key, split_parts

HERE = Path(__file__).parent
VERSIONS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kinds(manifests: list[WeightManifest]) -> list[tuple[int, str]]:
    return [(m.version, m.kind) for m in manifests]


def follow_one_by_one(syncer: Syncer, count: int) -> dict[int, dict[str, np.ndarray]]:
    """The target's bits after each manifest, read one at a time (so every delta applies)."""
    held = {}
    for _ in range(count):
        assert syncer.poll(timeout=5, max_records=1) == 1
        v = syncer.sync_once(read=False)
        assert v is not None
        held[v] = {k: b.copy() for k, (_d, b) in
                   ((k, syncer.target.host_bits(k)) for k in syncer.target.tensors)}
    return held


@pytest.mark.slow
def test_sharded_publish_matches_unsharded(tmp_path: Path) -> None:
    sys.path.insert(0, str(HERE))
    import sharded_worker as w

    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(HERE / "sharded_worker.py"), str(tmp_path),
         str(VERSIONS)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
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
