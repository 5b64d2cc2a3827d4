"""A far worker downloads the next version while its engine keeps decoding: the follower
prefetches the route's blobs over HTTP (rate-limited, as a slow link) before it asks the
engine for a safe point, so the engine is held only for the local decode-and-apply."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from astraflow.consumers.rollout.engines import build_engine
from astraflow.consumers.rollout.weights import WeightFollower
from astraflow.core.bus import Bus
from astraflow.models.tiny import load
from astraflow.weights.http import HttpStore, make_server
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from astraflow.weights.syncer import Syncer


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FileStore, str]]:
    store = FileStore(tmp_path / "weights")
    store.root.mkdir(parents=True, exist_ok=True)
    srv = make_server(store.root)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield store, srv.url
    srv.shutdown()
    srv.server_close()


def test_the_download_happens_before_the_safe_point(arith_dir: Path, bus: Bus, tmp_path: Path,
                                                    served: tuple[FileStore, str]) -> None:
    store, url = served
    engine = build_engine("hf", model_path=arith_dir, threads=1)
    trainer, _ = load(arith_dir)
    syncer = Syncer(bus, run="w", policy="default", store=HttpStore(url),
                    target=engine.weight_target(), cache_dir=tmp_path / "cache",
                    rate_limit=2e6)  # ~0.5 s for the tiny model's full snapshot
    inside: list[int] = []  # bytes downloaded while the engine was held
    sync_once = syncer.sync_once

    reads: list[bool] = []

    def held_sync(timeout: float = 0.0, *, read: bool = True) -> int | None:
        before, manifests = syncer.stats.fetched_bytes, syncer.stats.manifests
        reads.append(read)
        try:
            return sync_once(timeout, read=read)
        finally:
            inside.append(syncer.stats.fetched_bytes - before)
            assert syncer.stats.manifests == manifests  # no bus round trip while held

    syncer.sync_once = held_sync  # type: ignore[method-assign]
    follower = WeightFollower(syncer, engine=engine)
    pub = Publisher(bus, run="w", policy="default", store=store, full_every=2)
    try:
        for version in (1, 2, 3):  # a full, a delta, a full and a delta
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            pub.publish(trainer.state_dict(), version)
            pub.flush()
            assert follower.sync_now(timeout=5) == version
        assert engine.version == 3 and follower.updates == 3 and follower.lag == 0
        assert inside == [0, 0, 0]  # every byte crossed the link before the safe point
        assert reads == [False, False, False]
        assert syncer.stats.prefetched_bytes == syncer.stats.fetched_bytes > 0
        assert follower.fetch_s > 0 and follower.apply_s > 0
        for name, p in engine.model.state_dict().items():
            want = trainer.state_dict()[name].to(torch.bfloat16).float()
            assert torch.equal(p, want), name
    finally:
        follower.close()
        pub.close()


def test_a_cut_prefetch_puts_the_sync_off_instead_of_downloading_while_held(
        arith_dir: Path, bus: Bus, tmp_path: Path, served: tuple[FileStore, str]) -> None:
    """A download that fails ahead of the safe point (a cut link) does not move inside it:
    the engine is not held until the blobs are local; the next poll resumes them."""
    from astraflow.core.errors import WeightStoreError
    from astraflow.weights.http import HttpStore as Http

    store, url = served
    engine = build_engine("hf", model_path=arith_dir, threads=1)
    trainer, _ = load(arith_dir)
    cut = {"on": True}

    class CutStore(Http):
        def open(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            if cut["on"]:
                raise WeightStoreError("connection reset by the link")
            return super().open(*args, **kwargs)  # type: ignore[arg-type]

    syncer = Syncer(bus, run="w", policy="default", store=CutStore(url),
                    target=engine.weight_target(), cache_dir=tmp_path / "cache")
    held: list[int] = []
    update = engine.update_weights

    def counted(fn):  # type: ignore[no-untyped-def]
        held.append(1)
        return update(fn)

    engine.update_weights = counted  # type: ignore[method-assign]
    follower = WeightFollower(syncer, engine=engine)
    pub = Publisher(bus, run="w", policy="default", store=store, full_every=2)
    try:
        pub.publish(trainer.state_dict(), 1)
        pub.flush()
        assert follower.sync_now(timeout=5) is None  # put off: nothing local, engine free
        assert (follower.put_off, held, syncer.prefetch_complete) == (1, [], False)
        cut["on"] = False
        assert follower.sync_now(timeout=0.1) == 1
        assert held == [1] and engine.version == 1 and follower.updates == 1
    finally:
        follower.close()
        pub.close()
