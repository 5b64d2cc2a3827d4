"""The regional mirror: each blob crosses the far link once, whatever the number of workers;
a bad blob in the mirror is caught by the digests and healed; a restarted mirror re-fetches
only what is missing or corrupt; the CLI serves and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import quote

import numpy as np
import pytest
from weights_helpers import mutate

from astraflow.core.bus import Bus
from astraflow.core.records import WeightManifest, decode
from astraflow.core.topics import topic_name
from astraflow.weights.http import HttpStore, WeightServer, make_server
from astraflow.weights.mirror import Mirror, serve_mirror, verify_blob
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore, WeightStore
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget

RUN, POLICY = "t", "solver"
VERSIONS, FULL_EVERY = 25, 5  # fulls 0, 5, 10, 15, 20; a delta for every version but 0
MANIFESTS = VERSIONS + VERSIONS // FULL_EVERY - 1


def evolve(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """n versions of a small model, each a ~1% optimizer-like step from the one before."""
    rng = np.random.default_rng(seed)
    out = [{"embed": rng.integers(0, 1 << 16, (256, 64), dtype=np.uint16),  # bf16 bits
            "norm": rng.standard_normal(64).astype(np.float32),
            "head": rng.standard_normal((8, 9)).astype(np.float16)}]
    for _ in range(n - 1):
        out.append({k: mutate(rng, v, 0.01) for k, v in out[-1].items()})
    return out


def identical(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        np.asarray(got[k]).shape == want[k].shape
        and np.asarray(got[k]).tobytes() == want[k].tobytes() for k in want)


def read_manifests(bus: Bus) -> list[WeightManifest]:
    topic = topic_name(RUN, "weights", POLICY)
    end = bus.describe_topic(topic).end_offsets[0]
    reader = bus.reader(topic)
    out: list[WeightManifest] = []
    try:
        while len(out) < end and (msgs := reader.consume(500, 5.0)):
            out += [cast(WeightManifest, decode(m.value, WeightManifest)) for m in msgs]
    finally:
        reader.close()
    return out


def url_path(m: WeightManifest) -> str:
    return "/" + quote(m.tensors[0].uri)


class CountingServer:
    """A weight server that counts the blob bytes it sends (a far link's egress) per path."""

    def __init__(self, server: WeightServer) -> None:
        self.gets: Counter[str] = Counter()
        self.bytes = 0
        lock = threading.Lock()
        self.server = server
        outer = self

        class Counting(server.RequestHandlerClass):  # type: ignore[name-defined,misc]
            code = 0

            def send_response(self, code: int, message: str | None = None) -> None:
                self.code = code
                super().send_response(code, message)

            def send_header(self, keyword: str, value: str) -> None:
                if keyword == "Content-Length" and self.command == "GET" and self.code in (200,
                                                                                          206):
                    with lock:
                        outer.gets[self.path] += 1
                        outer.bytes += int(value)
                super().send_header(keyword, value)

        server.RequestHandlerClass = Counting
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    @property
    def url(self) -> str:
        return self.server.url

    def reset(self) -> None:
        self.gets.clear()
        self.bytes = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Region:
    versions: list[dict[str, np.ndarray]]
    manifests: list[WeightManifest]
    upstream: CountingServer  # the trainer's server, across the far link
    mirror: Mirror
    root: Path  # the mirror's directory

    def manifest(self, version: int, kind: str) -> WeightManifest:
        return next(m for m in self.manifests if (m.version, m.kind) == (version, kind))

    def blob(self, version: int, kind: str) -> Path:
        return self.root / self.manifest(version, kind).tensors[0].uri


def publish(bus: Bus, store: WeightStore, versions: list[dict]) -> None:
    pub = Publisher(bus, run=RUN, policy=POLICY, store=store, dtype=None, full_every=FULL_EVERY)
    for v, tensors in enumerate(versions):
        pub.publish(tensors, v)
        pub.flush()
    pub.close()


@pytest.fixture
def servers() -> list[CountingServer]:
    started: list[CountingServer] = []
    yield started
    for s in started:
        s.close()


@pytest.fixture
def region(bus: Bus, store: FileStore, servers, tmp_path: Path) -> Region:
    """25 published versions, mirrored once from the trainer's server."""
    versions = evolve(VERSIONS)
    publish(bus, store, versions)
    upstream = CountingServer(make_server(store.root))
    servers.append(upstream)
    mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=HttpStore(upstream.url),
                    root=tmp_path / "mirror", retry_s=0.0)
    assert mirror.mirror_once(timeout=5) == 0
    return Region(versions, read_manifests(bus), upstream, mirror, tmp_path / "mirror")


def flip(path: Path, m: WeightManifest) -> None:
    """Flip one payload byte of the first tensor the decoder must read."""
    entry = next(t for t in m.tensors if t.length > 0)
    data = bytearray(path.read_bytes())
    data[entry.offset + entry.length // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_each_blob_crosses_the_far_link_once_whatever_the_workers(bus, store, servers,
                                                                  tmp_path: Path) -> None:
    """Two regions follow the trainer live: A with 1 worker, B with 4, every worker with the
    trainer's server as its fallback. The trainer sends each region every blob once, the same
    bytes; the workers get every byte from their mirror (a request for a blob still being
    mirrored waits for it instead of falling back) and end bit-exact at the newest version."""
    versions = evolve(VERSIONS)
    store.root.mkdir(parents=True)
    regions, threads = {}, []
    for name, workers in (("a", 1), ("b", 4)):
        upstream = CountingServer(make_server(store.root))
        mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=HttpStore(upstream.url),
                        root=tmp_path / name)
        served = CountingServer(serve_mirror(mirror, hold_s=10))
        servers += [upstream, served]
        syncers = [Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(served.url),
                          fallback=HttpStore(upstream.url), target=DictTarget({}),
                          cache_dir=tmp_path / f"cache-{name}{i}") for i in range(workers)]
        regions[name] = (upstream, served, mirror, syncers)
        threads += [threading.Thread(target=mirror.run, kwargs={
            "max_records": MANIFESTS, "timeout": 30, "poll_timeout": 0.1})]
        threads += [threading.Thread(target=s.run, kwargs={
            "max_records": MANIFESTS, "timeout": 30, "poll_timeout": 0.1}) for s in syncers]
    threads.append(threading.Thread(target=publish, args=(bus, store, versions)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    manifests = read_manifests(bus)
    assert len(manifests) == MANIFESTS
    for name, (upstream, served, mirror, syncers) in regions.items():
        for syncer in syncers:
            assert syncer.version == VERSIONS - 1, name
            assert identical(cast(DictTarget, syncer.target).tensors, versions[-1])
            assert syncer.stats.fallbacks == 0, name
            syncer.close()
        assert dict(upstream.gets) == {url_path(m): 1 for m in manifests}, name
        assert upstream.bytes == sum(m.total_bytes for m in manifests)
        assert (mirror.stats.fetched, mirror.stats.verify_failures) == (MANIFESTS, 0)
        assert served.bytes == sum(s.stats.fetched_bytes for s in syncers) > 0
        mirror.close()
    assert regions["a"][0].bytes == regions["b"][0].bytes  # the trainer's egress: constant


def test_a_corrupt_blob_in_the_mirror_heals_from_the_fallback(bus, region, servers,
                                                              tmp_path: Path) -> None:
    """The mirror's copies of full 20 and delta 22 (a worker's route from nothing) are
    corrupted after they were mirrored. With fallback=upstream a worker fetches those two from
    the trainer and reaches the newest version; without, it routes around them and stops at
    21, the newest it can verify. Neither applies a bad byte."""
    for version, kind in ((20, "full"), (22, "delta")):
        flip(region.blob(version, kind), region.manifest(version, kind))
    served = make_server(region.root)
    threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    region.upstream.reset()
    try:
        for fallback in (HttpStore(region.upstream.url), None):
            target = DictTarget({})
            syncer = Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(served.url),
                            fallback=fallback, target=target,
                            cache_dir=tmp_path / f"cache-{fallback is None}")
            reached = syncer.sync_once(timeout=5)
            assert reached == (VERSIONS - 1 if fallback else 21)
            assert target.current_version() == reached
            assert identical(target.tensors, region.versions[reached])
            assert syncer.stats.fallbacks == (2 if fallback else 0)
            assert syncer.stats.heals == 2
            syncer.close()
    finally:
        served.shutdown()
        served.server_close()
    # only the two bad blobs came from the trainer (full 20 twice: after the bad delta 22 the
    # worker cannot tell whether it wrote into its weights, so it starts again from the full)
    assert set(region.upstream.gets) == {url_path(region.manifest(20, "full")),
                                         url_path(region.manifest(22, "delta"))}


def test_a_restarted_mirror_refetches_only_what_is_missing_or_corrupt(bus, region) -> None:
    """Over the same directory: a truncated blob and a corrupt one are fetched again, a blob
    whose download was cut (its .part staged) is resumed, the other 26 are verified and kept."""
    region.mirror.close()
    truncated, corrupt, cut = region.blob(7, "delta"), region.blob(10, "full"), region.blob(
        12, "delta")
    truncated.write_bytes(truncated.read_bytes()[:-5])
    flip(corrupt, region.manifest(10, "full"))
    data = cut.read_bytes()
    (cut.parent / f".{cut.name}.mirror.part").write_bytes(data[:len(data) // 2])
    cut.unlink()
    region.upstream.reset()
    mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=HttpStore(region.upstream.url),
                    root=region.root)
    assert mirror.mirror_once(timeout=5) == 0
    assert dict(region.upstream.gets) == {
        url_path(region.manifest(v, k)): 1 for v, k in ((7, "delta"), (10, "full"),
                                                        (12, "delta"))}
    assert region.upstream.bytes == mirror.stats.fetched_bytes == (
        region.manifest(7, "delta").total_bytes + region.manifest(10, "full").total_bytes
        + len(data) - len(data) // 2)
    s = mirror.stats
    assert (s.present, s.fetched, s.verify_failures) == (MANIFESTS - 3, 3, 2)
    for m in region.manifests:
        verify_blob(region.root / m.tensors[0].uri, m)
    assert not list(region.root.rglob(".*"))  # no staging file left
    mirror.close()


def test_bad_blobs_upstream_are_retried_then_skipped(bus, store, tmp_path: Path) -> None:
    """A blob corrupt at the source fails verification max_attempts times and is skipped,
    never served; a blob the trainer pruned (404) is retried on a later pass, not fatal."""
    versions = evolve(8)
    publish(bus, store, versions)
    manifests = read_manifests(bus)
    bad, gone = (next(m for m in manifests if m.version == v and m.kind == "delta")
                 for v in (3, 5))
    flip(store.local_path(bad.tensors[0].uri), bad)
    hidden = store.local_path(gone.tensors[0].uri)
    hidden.rename(hidden.with_name("kept-aside"))
    mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=store, root=tmp_path / "m",
                    max_attempts=3, retry_s=0.0)
    assert mirror.mirror_once(timeout=5) == 1  # the pruned one waits
    s = mirror.stats
    assert (s.verify_failures, s.skipped, s.upstream_errors) == (3, 1, 1)
    assert not (tmp_path / "m" / bad.tensors[0].uri).exists()
    hidden.with_name("kept-aside").rename(hidden)
    assert mirror.mirror_once() == 0
    assert mirror.stats.fetched == len(manifests) - 1
    assert not list((tmp_path / "m").rglob(".*"))
    mirror.close()


def test_an_unreachable_upstream_is_retried(bus, store, servers, tmp_path: Path) -> None:
    publish(bus, store, evolve(3))
    probe = make_server(store.root)  # a free port, closed again: nothing listens there
    port = probe.server_address[1]
    probe.server_close()
    mirror = Mirror(bus, run=RUN, policies=[POLICY], upstream=HttpStore(
        f"http://127.0.0.1:{port}", timeout=2), root=tmp_path / "m", retry_s=0.0)
    stats = mirror.run(timeout=0.3, poll_timeout=0.1)
    assert stats.upstream_errors >= 1 and stats.fetched == 0 and mirror.pending == 3
    servers.append(CountingServer(make_server(store.root, port=port)))
    assert mirror.mirror_once() == 0 and mirror.stats.fetched == 3
    mirror.close()


def test_keep_versions_prunes_what_no_route_needs(bus, region, tmp_path: Path) -> None:
    """keep_versions=3 at newest 24: versions from the newest full (20) on are kept; older
    ones are neither fetched by a new mirror nor kept by a running one."""
    region.upstream.reset()
    fresh = Mirror(bus, run=RUN, policies=[POLICY], upstream=HttpStore(region.upstream.url),
                   root=tmp_path / "fresh", keep_versions=3)
    assert fresh.mirror_once(timeout=5) == 0
    kept = {url_path(m): 1 for m in region.manifests if m.version >= 20}
    assert dict(region.upstream.gets) == kept
    region.mirror.keep_versions = 3
    region.mirror.mirror_once()
    for root in (tmp_path / "fresh", region.root):
        assert sorted("/" + quote(p.relative_to(root).as_posix())
                      for p in root.rglob("*.afw")) == sorted(kept)
    assert region.mirror.stats.pruned == len(region.manifests) - len(kept)
    target = DictTarget({})
    syncer = Syncer(bus, run=RUN, policy=POLICY, store=FileStore(region.root), target=target)
    assert syncer.sync_once(timeout=5) == VERSIONS - 1
    assert identical(target.tensors, region.versions[-1])
    syncer.close()
    fresh.close()


def test_cli_mirrors_serves_and_stops_on_sigterm(bus, store, servers, tmp_path: Path) -> None:
    versions = evolve(6)
    publish(bus, store, versions)
    manifests = read_manifests(bus)
    upstream = CountingServer(make_server(store.root))
    servers.append(upstream)
    root = tmp_path / "mirror"
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASTRAFLOW_BUS", "ASTRAFLOW_WEIGHTS_TOKEN")}
    child = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.app", "weights", "mirror", upstream.url,
         "--serve", str(root), "--port", "0", "--bus", bus.url, "--run", RUN,
         "--policy", POLICY], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "the mirror printed nothing in 30 s"
        line = child.stdout.readline()
        url = re.search(r"at (http://\S+)", line)
        assert url, (line, child.poll())
        deadline = time.monotonic() + 30
        while not all((root / m.tensors[0].uri).exists() for m in manifests):
            assert time.monotonic() < deadline and child.poll() is None, "not mirrored"
            time.sleep(0.05)
        target = DictTarget({})
        syncer = Syncer(bus, run=RUN, policy=POLICY, store=HttpStore(url[1]), target=target,
                        cache_dir=tmp_path / "cache")
        assert syncer.sync_once(timeout=5) == len(versions) - 1
        assert identical(target.tensors, versions[-1])
        syncer.close()
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert f"fetched={len(manifests)} " in out
    assert f"mirrored policy={POLICY} version={len(versions) - 1}" in err
    assert dict(upstream.gets) == {url_path(m): 1 for m in manifests}
