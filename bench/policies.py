"""Records/s through the full post-rollout chain (assembler → staleness → dynamic sampling)
against the bus's raw consume → produce rate, measured on the same bus in the same run.

    python -m bench.policies                  # embedded, and Kafka on a local broker
    python -m bench.policies --no-kafka --groups 2000 --tokens 600

Input: realistic trajectories (``--group-size`` per group, ``--tokens`` tokens each, a fifth
of them prompt; packed int32/float32/uint8 arrays; a third of the groups zero-variance),
produced to ``trajectories`` before timing starts. Three paths read that same topic:

* ``raw``: consume → produce the same bytes to another topic → flush → commit (no decoding);
* ``typed``: ``core.stream.run_processor`` with an identity handler (decode, re-encode, DLQ);
* ``post_rollout``: the stage processor with its checkpoints (state + outbox, fsynced).

Time runs from the first record consumed to the last one committed (consumer joins are
excluded); after ``--warmup`` unmeasured runs, each path runs ``--repeats`` times,
interleaved, median reported. The chain emits one group per ``--group-size`` trajectories
(plus a GroupStats each), so it produces fewer, larger records than ``raw``; its cycles
(checkpoint + produce + commit) run at most every ``commit_interval_s`` (1 s) under load,
where ``raw`` commits every poll. Nothing here gates CI.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from astraflow.config import ExperimentConfig
from astraflow.core.bus import embedded_url
from astraflow.core.bus.types import Bus
from astraflow.core.records import (
    Trajectory,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
)
from astraflow.core.stream import Output, run_processor
from astraflow.core.topics import topic_name
from astraflow.policies.registry import build_chain
from astraflow.policies.runner import StageRunner, stage_topics
from astraflow.run.resources import open_bus


def trajectories(groups: int, size: int, tokens: int, seed: int = 0) -> list[Trajectory]:
    import numpy as np

    rng = random.Random(seed)
    prompt = tokens // 5
    ids = np.arange(tokens, dtype="<i4") % 50_000
    mask = pack_u8([0] * prompt + [1] * (tokens - prompt))
    logp = pack_f32(np.linspace(-3, 0, tokens))
    out = []
    for g in range(groups):
        kind = g % 3  # 0: mixed, 1: all right, 2: all wrong
        versions = pack_i32([-1] * prompt + [g // 64] * (tokens - prompt))
        for i in range(size):
            reward = float(rng.random() < 0.5) if kind == 0 else float(kind == 1)
            out.append(Trajectory(
                id=f"g{g}/{i}", task_id=f"t{g}", group_id=f"t{g}#0", sample_index=i,
                token_ids=ids.tobytes(), loss_mask=mask, logprobs=logp, versions=versions,
                prompt_len=prompt, reward=reward, worker_id="bench"))
    return out


def fill(bus: Bus, topic: str, records: list[Trajectory]) -> int:
    p = bus.producer()
    total = 0
    for i, t in enumerate(records):
        value = encode(t)
        total += len(value)
        p.produce(topic, value, key=t.group_id.encode(), headers=[schema_header(t)])
        if i % 500 == 499:
            p.flush()
    p.flush()
    p.close()
    return total


def run_raw(bus: Bus, src: str, dst: str, n: int) -> float:
    c = bus.consumer(f"raw-{uuid.uuid4().hex[:8]}", [src])
    p = bus.producer()
    done, first = 0, None
    try:
        while done < n:
            msgs = c.consume(256, 1.0)
            if not msgs:
                continue
            first = first or time.perf_counter()
            for m in msgs:
                p.produce(dst, m.value, key=m.key, headers=m.headers)
            p.flush()
            c.commit()
            done += len(msgs)
        return time.perf_counter() - (first or time.perf_counter())
    finally:
        c.close()
        p.close()


def run_typed(bus: Bus, src: str, dst: str, dlq: str, n: int) -> float:
    first: list[float] = []

    def handle(t: Trajectory, msg: object) -> list[Output]:
        if not first:
            first.append(time.perf_counter())
        return [Output(dst, t, t.group_id.encode())]

    run_processor(bus, group=f"typed-{uuid.uuid4().hex[:8]}", inputs=[src], kind=Trajectory,
                  handle=handle, dlq=dlq, max_records=n, batch_size=256)
    return time.perf_counter() - first[0]


def run_stage(bus: Bus, cfg: ExperimentConfig, ckpt_dir: Path, n: int) -> float:
    policies = tuple(cfg.policies)
    chain = build_chain(cfg.data, "post_rollout", policies=policies, seed=cfg.seed)
    topics = stage_topics(cfg.run, "post_rollout", chain, policies=policies,
                          primary=policies[0], policy=None)
    tag = uuid.uuid4().hex[:8]
    runner = StageRunner(bus, chain, topics, stage="post_rollout", policy=None,
                         checkpoint=ckpt_dir / f"{tag}.ckpt", group=f"post-{tag}",
                         commit_interval_s=cfg.data.commit_interval_s,
                         poll_records=cfg.data.poll_records)
    first: list[float] = []
    main = runner._main

    def timed(msgs: list) -> int:  # the clock starts at the first record
        if msgs and not first:
            first.append(time.perf_counter())
        return main(msgs)

    runner._main = timed  # type: ignore[method-assign]
    counters = runner.run(max_records=n)
    elapsed = time.perf_counter() - first[0]
    assert counters["runner.in"] == n, counters
    return elapsed


def bench(url: str, label: str, args: argparse.Namespace, tmp: Path) -> list[tuple]:
    cfg = ExperimentConfig.model_validate({
        "run": f"bench{uuid.uuid4().hex[:6]}", "bus": {"url": url},
        "data": {"post_rollout": ["assembler", "staleness", "dynamic_sampling"],
                 "assembler": {"group_size": args.group_size},
                 "max_staleness": 1000, "poll_records": 256}})
    bus = open_bus(cfg, tmp)
    src = topic_name(cfg.run, "trajectories")
    scratch = f"af.{cfg.run}.bench-out"
    bus.create_topics({scratch: 8})
    records = trajectories(args.groups, args.group_size, args.tokens)
    n = len(records)
    nbytes = fill(bus, src, records)
    print(f"{label}: {n} trajectories, {nbytes / n / 1024:.1f} KiB each", file=sys.stderr)
    paths = {
        "raw consume→produce": lambda: run_raw(bus, src, scratch, n),
        "typed run_processor": lambda: run_typed(bus, src, scratch,
                                                 topic_name(cfg.run, "dlq"), n),
        "post_rollout chain": lambda: run_stage(bus, cfg, tmp / f"ckpt-{label}", n),
    }
    names = list(paths)
    for name in names[:args.warmup and len(names)] * args.warmup:  # connections, caches
        paths[name]()
    secs: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            s = paths[name]()
            secs[name].append(s)
            print(f"  {label:9s} {name:22s} {n / s:>9.0f} rec/s", file=sys.stderr)
    bus.close()
    base = n / statistics.median(secs[names[0]])
    rows = []
    for name in names:
        rps = n / statistics.median(secs[name])
        rows.append((label, name, rps, rps * nbytes / n / 1e6, rps / base))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.policies", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each path")
    ap.add_argument("--no-kafka", action="store_true", help="embedded bus only")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    root = Path(tmp.name)
    rows = bench(embedded_url(Path(root) / "bus.db"), "embedded", args, root)
    if not args.no_kafka:
        from astraflow.core.broker import kafka_bootstrap

        with kafka_bootstrap(root, log=lambda m: print(m, file=sys.stderr)) as bootstrap:
            rows += bench(f"kafka://{bootstrap}", "kafka", args, root)
    print(f"\n{'bus':9s} {'path':22s} {'records/s':>10s} {'MB/s':>8s} {'vs raw':>8s}")
    for label, name, rps, mbs, ratio in rows:
        print(f"{label:9s} {name:22s} {rps:>10.0f} {mbs:>8.1f} {ratio:>7.2f}x")
    tmp.cleanup()


if __name__ == "__main__":
    main()
