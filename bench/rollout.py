"""Rollout worker overhead: one worker against its own engine called directly (the ceiling).

    python bench/rollout.py            # 256 tasks x 8 samples per measurement, ~1-2 minutes
    python bench/rollout.py --quick    # 64 tasks x 8 samples
    python bench/rollout.py --quick --continuous   # the hf engine's continuous batching

Both sides use the same hf engine on the tiny arith model (built here, no download), the same
prompts (``a+b=`` through the chat template), the same sampling (temperature 1, up to 4 new
tokens) and the same batch size:

* **ceiling**: ``engine.generate`` on batches of ``--batch`` requests in a loop (with
  ``--continuous``, the engine batches itself: the same calls, each request joining the
  running batch);
* **engine process** (``--process``): the worker's engine, decoding in a process of its own
  (``rollout.engine.process``), called directly the same way, one batch at a time;
* **worker**: ``RolloutWorker`` on the embedded bus: tasks are on ``tasks`` before it starts;
  it consumes them, runs ``single_turn`` (tokenize, generate through the async batcher,
  exact-match reward), produces Trajectory records, flushes and commits, then drains. Its
  engine batch is the same; its ``max_concurrent_episodes`` is twice that by default, so that
  the next batch is queued while one runs (``--concurrency``).

Reported: episodes/s and generated tokens/s of each (median of interleaved repeats, after a
warm-up), worker / ceiling, and per side as the engine ran it: the mean batch (requests per
``generate`` call, or with ``--continuous`` the engine's own count of sequences per decoding
step, ``Batcher.mean_batch``: requests reach a continuous engine one call each, so requests
per call would always read 1) and the model's forward passes. A continuous engine whose
requests arrive spread over its steps, as a worker's do, prefills the newcomers of a step in
a forward pass of their own, next to the running rows' decoding pass. Timing noise on shared
2-core machines is large; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def build_model(root: Path) -> Path:
    from astraflow.models.tiny import build_model as build
    from astraflow.models.tiny import build_tokenizer, save

    tok = build_tokenizer("arith")
    return save(build(tok, seed=0), tok, root / "tiny-arith")


def tasks(n: int, samples: int) -> list[Any]:
    from astraflow.core.records import ChatMessage, Task

    return [Task(id=f"b{i}", dataset="bench",
                 prompt=[ChatMessage(role="user", content=f"{i % 100}+{(i * 7) % 100}=")],
                 reference={"answer": str(i % 100 + (i * 7) % 100)}, n_samples=samples)
            for i in range(n)]


def ceiling(engine: Any, task_list: list[Any], batch: int,
            max_new: int) -> tuple[float, int, int, float, int]:
    """(seconds, episodes, generated tokens, mean batch, forward passes) of the engine called
    directly."""
    from astraflow.consumers.rollout.batcher import step_counts
    from astraflow.consumers.rollout.engines import GenRequest
    from astraflow.models.prompt import encode, render

    tok = engine.tokenizer
    reqs = []
    for t in task_list:
        ids = encode(tok, render(tok, t.prompt, generation_prompt=True), special=True)
        reqs += [GenRequest(ids, max_new_tokens=max_new, temperature=1.0)] * t.n_samples
    steps0, forwards0 = step_counts(engine), engine.steps
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(reqs), batch):
        tokens += sum(len(r.token_ids) for r in engine.generate(reqs[i:i + batch]))
    seconds = time.perf_counter() - start
    steps = step_counts(engine)
    if steps is None or steps0 is None:
        mean = len(reqs) / math.ceil(len(reqs) / batch)
    else:  # sequences per decoding step
        mean = (steps[0] - steps0[0]) / max(1, steps[1] - steps0[1])
    return seconds, len(reqs), tokens, mean, engine.steps - forwards0


def worker_run(engine: Any, task_list: list[Any], concurrency: int, max_new: int,
               root: Path) -> tuple[float, int, int, float, int]:
    """(seconds, episodes, generated tokens, mean batch, forward passes) of one worker on the
    embedded bus."""
    from astraflow.consumers.rollout.runtime import Runtime
    from astraflow.consumers.rollout.worker import RolloutWorker
    from astraflow.core.bus import connect, embedded_url
    from astraflow.core.records import encode, schema_header
    from astraflow.core.topics import run_topics, topic_name

    run = f"bench{time.monotonic_ns() % 10**9}"
    bus = connect(embedded_url(Path(root) / f"{run}.db"))
    bus.create_topics(run_topics(run, ["default"]))
    p = bus.producer()
    for t in task_list:
        p.produce(topic_name(run, "tasks"), encode(t), key=t.id.encode(),
                  headers=[schema_header(t)])
    p.flush()
    p.close()
    runtime = Runtime.create({"default": engine}, sampling={"max_new_tokens": max_new})
    w = RolloutWorker(bus, runtime, run=run, max_concurrent_episodes=concurrency,
                      poll_timeout=0.02,
                      commit_interval=0.2, metrics_interval=5.0, drain_timeout=600)
    forwards0 = engine.steps
    start = time.perf_counter()
    stats = w.run(max_tasks=len(task_list))
    seconds = time.perf_counter() - start
    b = runtime.batchers["default"]
    bus.close()
    assert stats.tasks_done == len(task_list), stats
    return (seconds, stats.episodes, stats.tokens_generated, b.mean_batch or 0.0,
            engine.steps - forwards0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=None,
                    help="worker max_concurrent_episodes (default: 2 x batch, so that a full "
                         "batch waits while one runs)")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--continuous", action="store_true",
                    help="the hf engine's continuous batching (rollout.engine.continuous)")
    ap.add_argument("--process", action="store_true",
                    help="the worker's engine decodes in a process of its own "
                         "(rollout.engine.process); the ceiling stays the in-process engine")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.repeats = 64, 2
    concurrency = args.concurrency or 2 * args.batch

    from astraflow.consumers.rollout.engines import build_engine

    with tempfile.TemporaryDirectory(prefix="af-bench-rollout-") as d:
        root = Path(d)
        engine = build_engine("hf", model_path=build_model(root), threads=args.threads,
                              max_batch_size=args.batch, continuous=args.continuous)
        worker_engine = (build_engine("hf", model_path=root / "tiny-arith", threads=args.threads,
                                      max_batch_size=args.batch, process=True)
                         if args.process else engine)
        task_list = tasks(args.tasks, args.samples)
        ceiling(engine, task_list[:16], args.batch, args.max_new_tokens)  # warm-up
        ceiling(worker_engine, task_list[:16], args.batch, args.max_new_tokens)
        # per side and repeat: episodes/s, generated tokens/s, mean batch, forward passes
        rows: dict[str, list[tuple[float, float, float, int]]] = {"ceiling": [], "worker": []}
        if args.process:
            rows["engine process"] = []
        for _ in range(args.repeats):  # interleaved, so drifts hit both sides alike
            s, e, k, mb, fw = ceiling(engine, task_list, args.batch, args.max_new_tokens)
            rows["ceiling"].append((e / s, k / s, mb, fw))
            if args.process:  # the engine process called directly, one batch at a time
                s, e, k, mb, fw = ceiling(worker_engine, task_list, args.batch,
                                          args.max_new_tokens)
                rows["engine process"].append((e / s, k / s, mb, fw))
            s, e, k, mb, fw = worker_run(worker_engine, task_list, concurrency,
                                         args.max_new_tokens, root)
            rows["worker"].append((e / s, k / s, mb, fw))
    med = {name: tuple(statistics.median(r[i] for r in v) for i in range(4))
           for name, v in rows.items()}
    episodes = args.tasks * args.samples
    print(f"# rollout bench: {args.tasks} tasks x {args.samples} samples = {episodes} episodes, "
          f"engine batch {args.batch}, worker concurrency {concurrency}, max "
          f"{args.max_new_tokens} new tokens, torch threads {args.threads}, "
          f"{'continuous' if args.continuous else 'static'} batching, median of "
          f"{args.repeats}\n")
    unit = "sequences per decoding step" if args.continuous else "requests per engine call"
    print(f"| | episodes/s | generated tokens/s | mean batch ({unit}) | forward passes |")
    print("|---|---:|---:|---:|---:|")
    for name, (eps, tps, mb, fw) in med.items():
        print(f"| {name} | {eps:,.0f} | {tps:,.0f} | {mb:.1f} | {fw:.0f} |")
    print(f"| worker / ceiling | {med['worker'][0] / med['ceiling'][0]:.2f} | "
          f"{med['worker'][1] / med['ceiling'][1]:.2f} | | |")
    if "engine process" in med:
        proc = med["engine process"]
        print(f"| worker / engine process | {med['worker'][0] / proc[0]:.2f} | "
              f"{med['worker'][1] / proc[1]:.2f} | | |")
    engine.close()
    if worker_engine is not engine:
        worker_engine.close()


if __name__ == "__main__":
    main()
