"""Batches by reference: how fast the trainer fetches a batch's trajectories from the bus,
against reading the same records sequentially, on the same bus in the same run.

    python -m bench.fetch                       # embedded, and Kafka on a local broker
    python -m bench.fetch --no-kafka --trajectories 1024 --tokens 512

A batch of ``--trajectories`` trajectories of ``--tokens`` tokens each (4,096 × 2,048 by
default: ≈ 107 MB of packed arrays; as one record with copies it would be ~100× Kafka's
default 1 MB message limit). Setup (not timed): the batch's records are produced to one
topic on their own, in order (``sequential``), and to a second topic interleaved with as many
records of other groups (``--interleave``: 1 of every k records is the batch's, as when many
workers' trajectories share the topic), both with ``--partitions`` partitions.

* ``sequential``: a group-less reader reads the first topic to its end and decodes every
  record — the floor: the same bytes, read once, in order, no addressing;
* ``by reference``: ``trainer.loop.resolve`` on a Batch of TrajRefs into the second topic —
  what the trainer does for each batch (fetch by address, decode, check ids).

Each runs ``--repeats`` times, interleaved; the median is reported with the ratio
(sequential time / by-reference time: 1.0 means fetching by address costs nothing extra).
Nothing here gates CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from astraflow.consumers.trainer.loop import resolve
from astraflow.core.bus import connect, embedded_url
from astraflow.core.bus.reader import read_all
from astraflow.core.bus.types import Bus
from astraflow.core.records import (
    Batch,
    Group,
    Trajectory,
    TrajRef,
    decode,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
)


def make(n: int, tokens: int, tag: str) -> list[Trajectory]:
    prompt = tokens // 8
    ids = pack_i32(np.arange(tokens) % 50_000)
    mask = pack_u8([0] * prompt + [1] * (tokens - prompt))
    logp = pack_f32(np.linspace(-3, 0, tokens))
    vers = pack_i32([-1] * prompt + [0] * (tokens - prompt))
    return [Trajectory(id=f"{tag}{i}", task_id=f"t{i // 16}", group_id=f"{tag}g{i // 16}",
                       sample_index=i % 16, token_ids=ids, loss_mask=mask, logprobs=logp,
                       versions=vers, reward=float(i % 2)) for i in range(n)]


def setup(bus: Bus, batch: list[Trajectory], interleave: int, partitions: int
          ) -> tuple[str, Batch]:
    seq, mixed = (f"bench-fetch-{k}-{uuid.uuid4().hex[:6]}" for k in ("seq", "mixed"))
    bus.create_topics({seq: partitions, mixed: partitions})
    other = make(len(batch) * (interleave - 1), len(np.frombuffer(batch[0].loss_mask, "u1")),
                 "other")
    producer = bus.producer()
    for t in batch:
        producer.produce(seq, encode(t), key=t.group_id.encode(), headers=[schema_header(t)])
    it = iter(other)
    for t in batch:
        for u in [t] + [next(it) for _ in range(interleave - 1)]:
            producer.produce(mixed, encode(u), key=u.group_id.encode(),
                             headers=[schema_header(u)])
    producer.flush()
    producer.close()
    where: dict[str, tuple[int, int]] = {}
    for m in read_all(bus, mixed):
        tid = decode(m.value, Trajectory).id  # type: ignore[union-attr]
        if not tid.startswith("other"):
            where[tid] = (m.partition, m.offset)
    groups: dict[str, list[TrajRef]] = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append(
            TrajRef(t.id, mixed, *where[t.id], t.sample_index, t.reward))
    return seq, Batch(id="bench-0", policy="default", seq=0, groups=[
        Group(group_id=g, task_id=g, refs=refs) for g, refs in groups.items()])


def sequential(bus: Bus, topic: str) -> int:
    return sum(len(decode(m.value, Trajectory).token_ids) > 0  # type: ignore[union-attr]
               for m in read_all(bus, topic))


def by_reference(bus: Bus, batch: Batch) -> int:
    return sum(len(g.trajectories) for g in resolve(bus, batch).groups)


def bench(name: str, url: str, args: argparse.Namespace) -> tuple[str, float, float, float]:
    bus = connect(url)
    batch = make(args.trajectories, args.tokens, "b")
    mb = sum(len(encode(t)) for t in batch) / 1e6
    t0 = time.monotonic()
    seq_topic, refs = setup(bus, batch, args.interleave, args.partitions)
    print(f"{name}: set up {mb:.0f} MB × {1 + args.interleave} in "
          f"{time.monotonic() - t0:.0f}s", file=sys.stderr)
    runs = {"sequential": lambda: sequential(bus, seq_topic),
            "by reference": lambda: by_reference(bus, refs)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.repeats):
        for k in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            t = time.monotonic()
            n = runs[k]()
            times[k].append(time.monotonic() - t)
            assert n == args.trajectories, (k, n)
            print(f"  {name} {k:13s} {times[k][-1]:.2f}s", file=sys.stderr)
    bus.close()
    s, r = statistics.median(times["sequential"]), statistics.median(times["by reference"])
    return name, mb, s, r


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fetch",
                                 description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--interleave", type=int, default=2,
                    help="1 of every k records on the topic is the batch's")
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-kafka", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    rows = [bench("embedded", embedded_url(Path(tmp.name) / "bench.db"), args)]
    if not args.no_kafka:
        from astraflow.core.broker import kafka_bootstrap

        with kafka_bootstrap(Path(tmp.name), log=lambda m: print(m, file=sys.stderr)) as boot:
            rows.append(bench("kafka", f"kafka://{boot}", args))
    print(f"\nbatch: {args.trajectories} trajectories × {args.tokens} tokens, "
          f"{args.partitions} partitions, 1 in {args.interleave} records is the batch's")
    print(f"{'backend':10s} {'MB':>6s} {'sequential':>11s} {'by reference':>13s} "
          f"{'MB/s by ref':>12s} {'ratio':>6s}")
    for name, mb, s, r in rows:
        print(f"{name:10s} {mb:6.0f} {s:10.2f}s {r:12.2f}s {mb / r:12.0f} {s / r:6.2f}")


if __name__ == "__main__":
    main()
