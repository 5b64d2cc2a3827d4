"""``rollout.engine.speed`` on the wall clock: what tests/consumers/rollout/test_engine_speed.py checks on
the pacer's own clock (each computation followed by ``(1/s - 1)`` times its time asleep),
measured here as ratios against a full-speed baseline run in the same process.

    python -m bench.engine_speed            # both measurements, ~1-2 minutes
    python -m bench.engine_speed --quick    # fewer rounds and tasks

* **engine**: the tiny arith model's batched hf engine at ``--speed`` (default 1/3) and at
  full speed over the same greedy requests, in interleaved pairs: busy-time ratio (about
  ``1/s``) and CPU-time ratio (about 1: the wait sleeps, it holds no core); the medians
  over ``--repeats`` pairs;
* **worker**: a whole rollout worker (its own Python is not slowed) on the embedded bus over
  the same tasks at ``--worker-speed`` (default 0.3) and at 1.0, interleaved: episodes/s
  ratio (measured ~0.35-0.37 at 0.3 on 2 cores; 1.0 would mean no slowdown) and CPU-time
  ratio (about 1).

Timing noise on shared machines is large (a scheduler favours a thread that slept, so the
slowed arm computes faster than the plain one on a loaded machine); nothing here gates CI.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model


def busy_and_cpu(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``rounds`` calls of ``fn``."""
    t, c = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        fn()
    return time.perf_counter() - t, time.process_time() - c


def engine_ratios(model: Path, speed: float, rounds: int, reps: int) -> tuple[float, float]:
    """(busy ratio, CPU ratio) of the engine at ``speed`` over the same engine at full speed:
    the medians over ``reps`` pairs run back to back (so a load that comes and goes weighs on
    both arms of a pair, and one burst does not decide)."""
    from astraflow.consumers.rollout.engines import GenRequest, build_engine
    from astraflow.consumers.rollout.engines.speed import slowed

    hf = build_engine("hf", model_path=model, threads=1, seed=1)
    try:
        tok = hf.tokenizer
        reqs = [GenRequest(tok(f"{i}+{2 * i}=")["input_ids"], max_new_tokens=24,
                           temperature=0.0) for i in range(8)]
        slow = slowed(hf, speed)

        def plain() -> object:
            return hf.generate(reqs)

        def slowed_arm() -> object:
            return slow.generate(reqs)

        plain(), slowed_arm()  # warm-up
        busy, cpu = [], []
        for _ in range(reps):
            bp, cp = busy_and_cpu(plain, rounds)
            bs, cs = busy_and_cpu(slowed_arm, rounds)
            busy.append(bs / bp)
            cpu.append(cs / cp)
        return statistics.median(busy), statistics.median(cpu)
    finally:
        hf.close()


def worker_run(model: Path, root: Path, speed: float, tasks: int, i: int) -> tuple[float, float]:
    """(episodes/s, CPU seconds) of one worker at ``speed`` over ``tasks`` tasks of 8 samples."""
    from astraflow.config import ExperimentConfig
    from astraflow.core.records import ChatMessage, Task
    from astraflow.core.stream import Output, send
    from astraflow.core.topics import topic_name
    from astraflow.run.resources import open_bus
    from astraflow.run.roles import configured_worker

    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{root}/bus-{i}.db"},
        "rollout": {"engine": {"model": str(model), "threads": 1, "max_new_tokens": 8,
                               "speed": speed},
                    "weights": {"enabled": False}, "max_concurrent_episodes": 64,
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus = open_bus(cfg, root)
    try:
        producer = bus.producer()
        for k in range(tasks):  # the test's tasks: "k+1=" with the reference answer
            task = Task(id=f"task-{k}", dataset="t",
                        prompt=[ChatMessage(role="user", content=f"{k}+1=")],
                        reference={"answer": str(k + 1)}, n_samples=8)
            send(producer, Output(topic_name(cfg.run, "tasks"), task, task.id.encode()))
        producer.flush()
        worker = configured_worker(cfg, root, bus=bus)
        t, c = time.perf_counter(), time.process_time()
        stats = worker.run(max_tasks=tasks)
        dt, dc = time.perf_counter() - t, time.process_time() - c
    finally:
        bus.close()
    if stats.episodes != tasks * 8 or stats.episodes_failed:
        raise SystemExit(f"worker at speed {speed}: {stats.episodes} episodes "
                         f"({stats.episodes_failed} failed), expected {tasks * 8}")
    return stats.episodes / dt, dc


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_speed",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--speed", type=float, default=1 / 3, help="the engine arm's speed")
    ap.add_argument("--worker-speed", type=float, default=0.3, help="the worker arm's speed")
    ap.add_argument("--rounds", type=int, default=3, help="engine calls per timed arm")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved pairs per ratio")
    ap.add_argument("--tasks", type=int, default=32, help="tasks (x 8 samples) per worker run")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats, args.tasks = 1, 2, 8
    with tempfile.TemporaryDirectory(prefix="af-bench-speed-") as d:
        root = Path(d)
        model = tiny_model(root)
        busy, cpu = engine_ratios(model, args.speed, args.rounds, args.repeats)
        runs: dict[float, list[tuple[float, float]]] = {1.0: [], args.worker_speed: []}
        for i in range(args.repeats):  # interleaved, so drifts hit both sides alike
            for s in (1.0, args.worker_speed):
                runs[s].append(worker_run(model, root, s, args.tasks, 2 * i + (s != 1.0)))
    rate = (sum(r for r, _ in runs[args.worker_speed]) / sum(r for r, _ in runs[1.0]))
    wcpu = (sum(c for _, c in runs[args.worker_speed]) / sum(c for _, c in runs[1.0]))
    out = {"engine_busy_ratio": busy, "engine_cpu_ratio": cpu, "worker_rate_ratio": rate,
           "worker_cpu_ratio": wcpu}
    print(f"# rollout.engine.speed on the tiny arith model (torch threads 1), "
          f"{args.repeats} interleaved pairs\n")
    print("| | speed | slowed / full | expected |")
    print("|---|---:|---:|---:|")
    print(f"| engine busy time | {args.speed:.3g} | {busy:.2f} | {1 / args.speed:.2f} |")
    print(f"| engine CPU time | {args.speed:.3g} | {cpu:.2f} | 1.00 |")
    print(f"| worker episodes/s | {args.worker_speed:.3g} | {rate:.2f} | "
          f"{args.worker_speed:.2f} or a little more |")
    print(f"| worker CPU time | {args.worker_speed:.3g} | {wcpu:.2f} | about 1 |")
    return out


if __name__ == "__main__":
    main()
