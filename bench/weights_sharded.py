"""Rank 0's memory while publishing an FSDP2-sharded model: from the shards vs gather-then-encode.

    python -m bench.weights_sharded                  # 2 ranks (gloo, CPU), ~34 MB fp32 model
    python -m bench.weights_sharded --ranks 4 --width 2048

Each mode runs in its own ``torchrun`` (so one's high-water mark cannot hide the other's):
the model (``--layers`` Linear(width, width) + an uneven 3-row head, sharded by
``fully_shard``) is published twice: version 1 (a full snapshot) and version 2 (a sparse delta:
~2% of the weights moved). ``sharded``: every rank calls
:class:`~astraflow.weights.sharded.ShardedPublisher` with its shards. ``gathered``: every rank
gathers each DTensor (``full_tensor()``, an all-gather) and rank 0 publishes the whole model
with :class:`~astraflow.weights.publisher.Publisher` (``background=False``: the encode is
measured, not hidden in a thread), as an unsharded trainer under FSDP would.

Measured on rank 0, per publish: **peak RSS growth** (``/proc/self/statm`` sampled every
0.5 ms by a thread, minus the RSS just before the call, after ``malloc_trim``), which counts
torch's and numpy's allocations alike, including the publisher's copy of the last published
version it keeps for the next delta; and the **tracemalloc** peak (numpy and Python objects
only: not torch's tensors). Goal: sharded ≤ 1/N of the gathered model's bf16 size plus one
tensor. Prints a markdown table; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import tracemalloc
from pathlib import Path

from astraflow.core.ports import free_port

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """The highest RSS seen while the block runs, sampled by a thread."""

    def __enter__(self) -> PeakRss:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.before = self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        tracemalloc.start()
        self._t.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.0005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.peak, rss())
        self._stop.set()
        self._t.join()
        self.traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def worker(out: Path, mode: str, layers: int, width: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from astraflow.core.bus import connect
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.sharded import ShardedPublisher, shards_of
    from astraflow.weights.store import FileStore

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)], nn.Linear(width, 3))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    bus = connect(f"embedded://{out}/bus-{mode}.db") if rank == 0 else None
    store = FileStore(out / f"store-{mode}")
    if mode == "sharded":
        spub = ShardedPublisher(bus, run="b", policy=mode, store=store, rank=rank,
                                world_size=world, full_every=100)
    elif rank == 0:
        assert bus is not None
        gpub = Publisher(bus, run="b", policy=mode, store=store, full_every=100,
                         background=False)
    results = []
    for version in (1, 2):
        if version == 2:
            with torch.no_grad():
                g = torch.Generator().manual_seed(rank)
                for p in model.parameters():
                    local = p.to_local()
                    mask = torch.rand(local.shape, generator=g) < 0.02
                    local += mask * 0.01
        dist.barrier()
        with PeakRss() as m:
            if mode == "sharded":
                spub.publish(shards_of(model.state_dict(), rank), version)
            else:
                full = {k: v.full_tensor() for k, v in model.state_dict().items()}
                if rank == 0:
                    gpub.publish(full, version)
                del full
        results.append({"version": version, "rss": m.peak - m.before, "traced": m.traced})
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        largest = max(p.numel() for p in model.parameters())
        (out / f"{mode}.json").write_text(json.dumps(
            {"results": results, "params": params, "largest": largest, "world": world}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.weights_sharded",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--worker", choices=["sharded", "gathered"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.out, args.worker, args.layers, args.width)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        runs = {}
        for mode in ("gathered", "sharded"):
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                            str(args.ranks), "--master_port", str(free_port()), "-m",
                            "bench.weights_sharded",
                            "--worker", mode, "--out", str(out), "--layers", str(args.layers),
                            "--width", str(args.width)], check=True, timeout=1200)
            runs[mode] = json.loads((out / f"{mode}.json").read_text())
    g = runs["gathered"]
    n, bf16 = g["world"], 2 * g["params"]
    goal = bf16 / n + 2 * g["largest"]
    mb = 1e6
    print(f"model: {g['params'] / 1e6:.1f}M parameters ({4 * g['params'] / mb:.0f} MB fp32, "
          f"{bf16 / mb:.0f} MB bf16), {n} ranks; goal for sharded: bf16/N + one tensor = "
          f"{goal / mb:.1f} MB\n")
    print("| rank 0, per publish | gathered RSS MB | sharded RSS MB | ratio | "
          "gathered traced MB | sharded traced MB |")
    print("|---|---|---|---|---|---|")
    for i, what in enumerate(("v1 (full)", "v2 (delta)")):
        a, b = g["results"][i], runs["sharded"]["results"][i]
        print(f"| {what} | {a['rss'] / mb:.1f} | {b['rss'] / mb:.1f} | "
              f"{b['rss'] / max(1, a['rss']):.2f} | {a['traced'] / mb:.1f} | "
              f"{b['traced'] / mb:.1f} |")


if __name__ == "__main__":
    main()
