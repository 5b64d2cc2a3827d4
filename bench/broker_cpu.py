"""What the local development broker's JVM costs in CPU: to start, and a minute idle, with
its default options (``LocalBroker``'s ``DEV_JVM_FLAGS``) against the JVM's own defaults, in
the same run.

    python -m bench.broker_cpu                 # 60 s idle, each arm twice, interleaved
    python -m bench.broker_cpu --idle 10 --repeats 1

Each arm starts a fresh broker (its own data dir and ports), reads the JVM's CPU time
(user + system, from /proc) once it answers clients, waits ``--idle`` seconds with no client,
and reads it again; then stops it. The table gives the median of the repeats. Linux only
(/proc). Nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from astraflow.core.broker.local import DEV_JVM_FLAGS, LocalBroker

ARMS: dict[str, tuple[str, ...]] = {"dev flags": DEV_JVM_FLAGS, "JVM defaults": ()}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(root: Path, flags: tuple[str, ...], idle: float) -> tuple[float, float]:
    """(CPU-s to start, CPU-s over ``idle`` seconds with no client) of one fresh broker."""
    broker = LocalBroker(root, jvm_flags=flags)
    broker.start(timeout=120)
    try:
        pid = broker.pid()
        if pid is None:
            raise RuntimeError(f"the broker in {root} is not running after its start")
        started = cpu_seconds(pid)
        time.sleep(idle)
        return started, cpu_seconds(pid) - started
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=float, default=60.0, help="seconds idle per broker")
    ap.add_argument("--repeats", type=int, default=2, help="brokers per arm")
    args = ap.parse_args(argv)
    if args.idle <= 0 or args.repeats < 1:
        ap.error("--idle must be > 0 and --repeats at least 1")
    got: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="af-broker-cpu-") as tmp:
        for r in range(args.repeats):
            for arm, flags in ARMS.items():
                print(f"[{r + 1}/{args.repeats}] {arm}: starting, then {args.idle:.0f} s idle",
                      flush=True)
                got[arm].append(one(Path(tmp) / f"{arm.replace(' ', '-')}-{r}", flags,
                                    args.idle))
    print("\n| JVM options | CPU-s to start | CPU-s per minute idle |\n|---|---|---|")
    for arm, rows in got.items():
        start = statistics.median(s for s, _ in rows)
        idle = statistics.median(i for _, i in rows) * 60.0 / args.idle
        print(f"| {arm} ({' '.join(ARMS[arm]) or 'none'}) | {start:.1f} | {idle:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
