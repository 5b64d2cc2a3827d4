"""A syncer killed (SIGKILL) mid-download over a slow link resumes where it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
from waiting import eventually

from astraflow.weights.http import HttpStore, make_server
from astraflow.weights.publisher import Publisher
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget

CHILD = textwrap.dedent("""
    import sys
    from astraflow.core.bus import connect
    from astraflow.weights import DictTarget, HttpStore, Syncer
    bus_url, url, cache = sys.argv[1:4]
    syncer = Syncer(connect(bus_url), run="t", policy="p", store=HttpStore(url),
                    target=DictTarget({}), cache_dir=cache, rate_limit=300_000)
    print("started", flush=True)
    syncer.sync_once(timeout=10)
    print("finished", flush=True)
""")


def test_killed_syncer_resumes_download(bus, store, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # random bits do not compress: the full blob is ~1.5 MB, ~5 s at 300 kB/s
    model = {f"w{i}": rng.integers(0, 1 << 16, (256, 1024), dtype=np.uint16) for i in range(3)}
    pub = Publisher(bus, run="t", policy="p", store=store, dtype=None)
    pub.publish(model, 0)
    pub.close()
    server = make_server(store.root)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    cache = tmp_path / "cache"
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, bus.url, server.url, str(cache)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def part_size() -> int:
                parts = list(cache.rglob("*.part"))
                return parts[0].stat().st_size if parts else 0

            assert eventually(lambda: part_size() > 300_000 or child.poll() is not None, 60), \
                "the child never started downloading"
            assert child.poll() is None, child.communicate()
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
        (part,) = list(cache.rglob("*.part"))
        have = part.stat().st_size
        total = store.size(part.relative_to(cache).as_posix().removesuffix(".part"))
        assert 0 < have < total

        target = DictTarget({})
        syncer = Syncer(bus, run="t", policy="p", store=HttpStore(server.url), target=target,
                        cache_dir=cache)
        assert syncer.sync_once(timeout=5) == 0
        assert syncer.stats.fetched_bytes == total - have  # only the rest came over the link
        assert all(target.tensors[k].tobytes() == v.tobytes() for k, v in model.items())
        syncer.close()
    finally:
        server.shutdown()
        server.server_close()
