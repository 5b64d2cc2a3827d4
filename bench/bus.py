"""Bus throughput and latency, produce → consume, for both backends, against a raw
confluent-kafka loop on the same broker in the same run (the ceiling).

    python -m bench.bus                      # starts a local broker unless ASTRAFLOW_KAFKA_BOOTSTRAP
    python -m bench.bus --records 20000 --sizes 1024,65536

Throughput: a producer *process* writes N records (flushing every 500) while this process
consumes them; records/s = N / (last consumed - first produced). Latency: a paced run (the
producer sleeps between records so queues stay empty); end-to-end = consume time - the send
time written into each record. Throughput runs are repeated, interleaved, and the median is
reported. Prints a table; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

from astraflow.core.bus import connect, embedded_url

STAMP = struct.Struct("<d")


def payload(size: int) -> bytes:
    return os.urandom(size)  # incompressible: zstd must not flatter Kafka


# --------------------------------------------------------------------------- astraflow bus

def _produce_bus(url: str, topic: str, n: int, size: int, pace: float) -> None:
    bus = connect(url, max_message_bytes=max(1_000_000, size + 1024))
    p = bus.producer()
    body = payload(size - STAMP.size)
    for i in range(n):
        p.produce(topic, STAMP.pack(time.time()) + body, key=str(i).encode())
        if pace:
            p.flush()
            time.sleep(pace)
        elif i % 500 == 499:
            p.flush()
    p.flush()
    p.close()
    bus.close()


def run_bus(url: str, n: int, size: int, pace: float = 0.0) -> tuple[float, list[float]]:
    """(seconds from first produce to last consume, per-record latencies)."""
    bus = connect(url, max_message_bytes=max(1_000_000, size + 1024))
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    bus.create_topics({topic: 4})
    c = bus.consumer(f"bench-{uuid.uuid4().hex[:8]}", [topic], session_timeout=10)
    while not c.assignment():  # join before producing so latency excludes the join
        c.poll(0.1)
    proc = mp.get_context("spawn").Process(target=_produce_bus, args=(url, topic, n, size, pace))
    t0 = time.time()
    proc.start()
    lat: list[float] = []
    first = None
    while len(lat) < n:
        for m in c.consume(1000, 1.0):
            now = time.time()
            sent = STAMP.unpack_from(m.value)[0]
            first = sent if first is None else min(first, sent)
            lat.append(now - sent)
    end = time.time()
    proc.join()
    c.close()
    bus.delete_topics([topic])
    bus.close()
    return end - (first or t0), lat


# --------------------------------------------------------------------------- raw confluent-kafka

def _produce_raw(bootstrap: str, topic: str, n: int, size: int, pace: float) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "compression.type": "zstd", "linger.ms": 5})
    p.list_topics(topic, timeout=10)  # connect first, as the astraflow producer does
    body = payload(size - STAMP.size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, STAMP.pack(time.time()) + body, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.01)
        if pace:
            p.flush()
            time.sleep(pace)
        elif i % 500 == 499:
            p.flush()
    p.flush()


def run_raw(bootstrap: str, n: int, size: int, pace: float = 0.0) -> tuple[float, list[float]]:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 4, 1)]).values():
        f.result()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    while not c.assignment():
        c.poll(0.1)
    proc = mp.get_context("spawn").Process(target=_produce_raw,
                                           args=(bootstrap, topic, n, size, pace))
    proc.start()
    lat: list[float] = []
    first = None
    while len(lat) < n:
        # librdkafka's consume(n, t) waits for all n or the whole timeout: poll for the first
        # record, then take what is already buffered.
        first_msg = c.poll(1.0)
        batch = ([first_msg] + c.consume(999, 0)) if first_msg is not None else []
        for m in batch:
            if m.error():
                continue
            now = time.time()
            sent = STAMP.unpack_from(m.value())[0]
            first = sent if first is None else min(first, sent)
            lat.append(now - sent)
        if lat and len(lat) % 1000 < 5:
            c.commit(asynchronous=True)
    end = time.time()
    proc.join()
    c.close()
    for f in admin.delete_topics([topic]).values():
        f.result()
    return end - (first or end), lat


# --------------------------------------------------------------------------- main

def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bus",
                                 description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=60000, help="records per 1 KB run")
    ap.add_argument("--sizes", default="1024,65536")
    ap.add_argument("--latency-records", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5, help="throughput runs per backend (median)")
    ap.add_argument("--pace", type=float, default=0.004, help="seconds between paced records")
    args = ap.parse_args()

    from astraflow.core.broker import kafka_bootstrap

    tmp = tempfile.TemporaryDirectory()
    with kafka_bootstrap(Path(tmp.name), log=lambda m: print(m, file=sys.stderr)) as bootstrap:
        rows = []
        for size in (int(s) for s in args.sizes.split(",")):
            # 64 KB records: fewer of them, the same order of bytes.
            n = args.records if size <= 4096 else max(500, args.records * 1024 // size * 4)
            runs = {
                "raw confluent-kafka": lambda n=n, size=size, pace=0.0: run_raw(
                    bootstrap, n, size, pace),
                "astraflow kafka": lambda n=n, size=size, pace=0.0: run_bus(
                    f"kafka://{bootstrap}", n, size, pace),
                "astraflow embedded": lambda n=n, size=size, pace=0.0: run_bus(
                    embedded_url(Path(tmp.name) / f"bench-{size}.db"), n, size, pace),
            }
            for fn in runs.values():  # warm-up: connections, idempotent producer id, JIT
                fn(200, size, 0.0)
            names = list(runs)
            rates: dict[str, list[float]] = {name: [] for name in names}
            for rep in range(args.repeats):  # interleaved, rotated: noise hits all alike
                for name in names[rep % len(names):] + names[:rep % len(names)]:
                    secs, _ = runs[name]()
                    rates[name].append(n / secs)
                    print(f"  {name:20s} {size:>6d} B  {n / secs:>9.0f} rec/s", file=sys.stderr)
            results = {}
            for name in names:
                _, lat = runs[name](args.latency_records, size, args.pace)
                rps = statistics.median(rates[name])
                results[name] = (rps, rps * size / 1e6, pct(lat, 50) * 1e3, pct(lat, 99) * 1e3)
            ceiling = results["raw confluent-kafka"][0]
            for name, (rps, mbs, p50, p99) in results.items():
                rows.append((name, size, rps, mbs, p50, p99, rps / ceiling))
        print(f"\n{'backend':22s} {'size':>7s} {'records/s':>10s} {'MB/s':>8s} "
              f"{'p50 ms':>8s} {'p99 ms':>8s} {'vs raw kafka':>12s}")
        for name, size, rps, mbs, p50, p99, ratio in rows:
            print(f"{name:22s} {size:>7d} {rps:>10.0f} {mbs:>8.1f} {p50:>8.2f} {p99:>8.2f} "
                  f"{ratio:>11.2f}x")
    tmp.cleanup()


if __name__ == "__main__":
    main()
