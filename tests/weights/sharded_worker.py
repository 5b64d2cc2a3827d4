"""One rank of the sharded-publishing test (run by tests/rank_launcher.py, or torchrun, with the gloo backend): a small
model sharded by FSDP2's ``fully_shard``, its weights set to :func:`weights_of` ``(v)`` for
each version, published from the shards. Usage: ``sharded_worker.py OUT VERSIONS``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from astraflow.core.bus import connect
from astraflow.weights.sharded import ShardedPublisher, shards_of
from astraflow.weights.store import FileStore

FULL_EVERY = 3


def build_model() -> nn.Module:
    """dim 0 of 96 (even), 3 (uneven: rows 2 + 1) and 1 (rank 1's shard is empty)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 3), nn.Embedding(1, 64))


def weights_of(version: int) -> dict[str, torch.Tensor]:
    """The full weights of ``version``: version 1 random; then ~3% of the elements nudged
    (a sparse delta), except version 3, where every element moves (a delta too large: a full instead);
    with ``FULL_EVERY`` 3, version 6 is a scheduled full (and a delta)."""
    state = {k: v.detach().clone() for k, v in build_model().state_dict().items()}
    for v in range(2, version + 1):
        g = torch.Generator().manual_seed(v)
        for name in sorted(state):
            t = state[name]
            frac, scale = (1.0, 1.0) if v == 3 else (0.03, 0.05)
            mask = torch.rand(t.shape, generator=g) < frac
            t += mask * torch.randn(t.shape, generator=g) * scale
    return state


def main() -> None:
    out, versions = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.fsdp import fully_shard

    model = build_model()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    bus = connect(f"embedded://{out}/bus.db") if rank == 0 else None
    pub = ShardedPublisher(bus, run="t", policy="sharded", store=FileStore(out / "store"),
                           rank=rank, world_size=world, full_every=FULL_EVERY)
    for v in range(1, versions + 1):
        full = weights_of(v)
        with torch.no_grad():
            for shard in shards_of(model.state_dict(), rank):
                # this rank's rows of the version's weights, written into its own shard
                shard.local.copy_(full[shard.name][shard.start:shard.start + shard.rows])
            owned = {s.name: (s.start, s.rows) for s in shards_of(model.state_dict(), rank)}
        pub.publish(model.state_dict(), version=v)  # read by shards_of, as the loop calls it
    (out / f"rows-{rank}.txt").write_text(repr(sorted(owned.items())))
    pub.close()
    if bus is not None:
        bus.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
