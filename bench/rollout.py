"""Rollout worker overhead: one worker against its own engine called directly (the ceiling).

    python -m bench.rollout            # 256 tasks x 8 samples per measurement, ~1-2 minutes
    python -m bench.rollout --quick    # 64 tasks x 8 samples
    python -m bench.rollout --quick --continuous   # the hf engine's continuous batching
    python -m bench.rollout --config examples/smollm2_chain_sum.yaml   # a real model, ~4 min
    python -m bench.rollout --model smollm2 --tasks 16 --repeats 2 --continuous

Both sides use the same hf engine, the same prompts, the same sampling and the same batch
size. By default the model is the tiny arith one (built here, no download; its Python
overhead dominates), the prompts ``a+b=`` through the chat template, sampling at temperature
1 up to 4 new tokens, and the worker scores with exact_match. With ``--config`` (or
``--model smollm2``: examples/smollm2_chain_sum.yaml, SmolLM2-135M-Instruct, where the
engine's compute dominates) they are the config's: ``models.default`` resolved as `astraflow
run` resolves it, the first --tasks tasks of one pass of its producer (the train split, its
``system_prompt`` first), ``rollout.engine``'s temperature, top_p, stop and max_new_tokens
(and max_batch_size for --batch), the group size ``producer.n_samples`` for --samples, and
the worker scores with ``rollout.reward`` (its ``extract`` included); ``--threads`` stays 1,
as a pipeline's rollout role runs:

* **ceiling**: ``engine.generate`` on batches of ``--batch`` requests in a loop (with
  ``--continuous``, the engine batches itself: the same calls, each request joining the
  running batch);
* **engine process** (``--process``): the worker's engine, decoding in a process of its own
  (``rollout.engine.process``), called directly the same way, one batch at a time;
* **worker**: ``RolloutWorker`` on the embedded bus: tasks are on ``tasks`` before it starts;
  it consumes them, runs ``single_turn`` (tokenize, generate through the async batcher,
  the reward: exact_match, or the config's), produces Trajectory records, flushes and
  commits, then drains. Its engine batch is the same; its ``max_concurrent_episodes`` is
  twice that by default, so that the next batch is queued while one runs
  (``--concurrency``).

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
import itertools
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"smollm2": ROOT / "examples" / "smollm2_chain_sum.yaml"}  # --model: its config
#: --tasks, --samples, --batch, --max-new-tokens (full, --quick) without a config
TINY = {"tasks": (256, 64), "samples": 8, "batch": 64, "max_new_tokens": 4}
CONFIG_TASKS = (16, 8)  # --tasks with a config (full, --quick): ~25 s a side on SmolLM2


@dataclass
class Setup:
    """What both sides run: the model folder, the tasks, the sampling (GenRequest's fields:
    ``rollout.engine``'s SAMPLING_KEYS) and the worker's reward (Runtime.create's
    arguments)."""

    model: Path
    tasks: list[Any]
    sampling: dict[str, Any]
    reward: dict[str, Any] = field(default_factory=dict)
    label: str = "tiny-arith"


def tasks(n: int, samples: int) -> list[Any]:
    from astraflow.core.records import ChatMessage, Task

    return [Task(id=f"b{i}", dataset="bench",
                 prompt=[ChatMessage(role="user", content=f"{i % 100}+{(i * 7) % 100}=")],
                 reference={"answer": str(i % 100 + (i * 7) % 100)}, n_samples=samples)
            for i in range(n)]


def tiny_setup(root: Path, n: int, samples: int, max_new: int) -> Setup:
    return Setup(tiny_model(root), tasks(n, samples), {"max_new_tokens": max_new})


def config_setup(path: Path, root: Path, n: int, samples: int | None,
                 max_new: int | None) -> Setup:
    """The config's first policy: its model, the first ``n`` tasks the producer releases
    (group size ``samples``, default ``producer.n_samples``), ``rollout.engine``'s sampling
    (``max_new`` replacing max_new_tokens when given) and ``rollout.reward``."""
    from astraflow.config import load_experiment
    from astraflow.consumers.rollout.config import SAMPLING_KEYS
    from astraflow.core.errors import ConfigError
    from astraflow.producers import tasks as produced
    from astraflow.run.resources import model_dir

    cfg = load_experiment(path)
    policy = cfg.policies[0]
    pc = cfg.producer.model_copy(update={"epochs": 1,
                                         "n_samples": samples or cfg.producer.n_samples})
    task_list = list(itertools.islice(produced(pc, root), n))
    if len(task_list) < n:
        raise ConfigError(f"--tasks {n}: one pass of the producer of {path} has "
                          f"{len(task_list)} tasks; ask for at most that many")
    ec, rc = cfg.rollout.engine, cfg.rollout.reward
    sampling = {k: getattr(ec, k) for k in SAMPLING_KEYS}
    if max_new is not None:
        sampling["max_new_tokens"] = max_new
    return Setup(model_dir(cfg, policy, root), task_list, sampling,
                 {"reward": rc.name, "reward_kwargs": rc.kwargs, "extract": rc.extract},
                 label=f"{path.name} ({cfg.model(policy).path})")


def request(ids: list[int], sampling: dict[str, Any]) -> Any:
    """The GenRequest a worker's episode makes of ``sampling`` (its runtime's defaults)."""
    from astraflow.consumers.rollout.engines import GenRequest

    s = {"temperature": 1.0, "top_p": 1.0, "stop": (), "stop_token_ids": (), **sampling}
    return GenRequest(ids, max_new_tokens=int(s["max_new_tokens"]),
                      temperature=float(s["temperature"]), top_p=float(s["top_p"]),
                      stop=tuple(s["stop"]), stop_token_ids=tuple(s["stop_token_ids"]))


def ceiling(engine: Any, task_list: list[Any], batch: int,
            sampling: dict[str, Any]) -> tuple[float, int, int, float, int]:
    """(seconds, episodes, generated tokens, mean batch, forward passes) of the engine called
    directly."""
    from astraflow.consumers.rollout.batcher import step_counts
    from astraflow.models.prompt import render_prompt

    tok = engine.tokenizer
    reqs = []
    for t in task_list:
        ids = render_prompt(tok, t.prompt)[1]  # as the worker renders it
        reqs += [request(ids, sampling)] * t.n_samples
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


def worker_run(engine: Any, task_list: list[Any], concurrency: int, sampling: dict[str, Any],
               root: Path, reward: dict[str, Any]) -> tuple[float, int, int, float, int]:
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
    runtime = Runtime.create({"default": engine}, sampling=sampling, **reward)
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


def rate(x: float) -> str:
    """Three significant figures or more (a real model's episodes/s is single-digit)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=None,
                    help="run on this experiment config's model, tasks, sampling and reward "
                         "(default: the tiny arith model)")
    ap.add_argument("--model", choices=sorted(MODELS), default=None,
                    help="a named config, as --config: " + ", ".join(
                        f"{k}: {v.relative_to(ROOT)}" for k, v in MODELS.items()))
    ap.add_argument("--tasks", type=int, default=None,
                    help=f"tasks per measurement (default {TINY['tasks'][0]}; with a config "
                         f"{CONFIG_TASKS[0]}; --quick: {TINY['tasks'][1]} / {CONFIG_TASKS[1]})")
    ap.add_argument("--samples", type=int, default=None,
                    help=f"samples per task (default {TINY['samples']}; with a config its "
                         "producer.n_samples)")
    ap.add_argument("--batch", type=int, default=None,
                    help=f"engine batch (default {TINY['batch']}; with a config its "
                         "rollout.engine.max_batch_size)")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="worker max_concurrent_episodes (default: 2 x batch, so that a full "
                         "batch waits while one runs)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help=f"(default {TINY['max_new_tokens']}; with a config its "
                         "rollout.engine.max_new_tokens)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--continuous", action="store_true",
                    help="the hf engine's continuous batching (rollout.engine.continuous)")
    ap.add_argument("--process", action="store_true",
                    help="the worker's engine decodes in a process of its own "
                         "(rollout.engine.process); the ceiling stays the in-process engine")
    args = ap.parse_args()
    if args.model and args.config:
        ap.error("--model names a config: give --model or --config, not both")
    config = MODELS[args.model] if args.model else args.config
    if args.quick:
        args.repeats = 2
    if args.tasks is None:
        args.tasks = (CONFIG_TASKS if config else TINY["tasks"])[1 if args.quick else 0]
    if config is not None and args.batch is None:
        from astraflow.config import load_experiment

        args.batch = load_experiment(config).rollout.engine.max_batch_size
    args.batch = args.batch or TINY["batch"]
    concurrency = args.concurrency or 2 * args.batch

    from astraflow.consumers.rollout.engines import build_engine

    with tempfile.TemporaryDirectory(prefix="af-bench-rollout-") as d:
        root = Path(d)
        setup = (config_setup(config, root, args.tasks, args.samples, args.max_new_tokens)
                 if config else
                 tiny_setup(root, args.tasks, args.samples or TINY["samples"],
                            args.max_new_tokens or TINY["max_new_tokens"]))
        sampling = setup.sampling
        engine = build_engine("hf", model_path=setup.model, threads=args.threads,
                              max_batch_size=args.batch, continuous=args.continuous)
        worker_engine = (build_engine("hf", model_path=setup.model, threads=args.threads,
                                      max_batch_size=args.batch, process=True)
                         if args.process else engine)
        task_list = setup.tasks
        ceiling(engine, task_list[:16], args.batch, sampling)  # warm-up
        ceiling(worker_engine, task_list[:16], args.batch, sampling)
        # per side and repeat: episodes/s, generated tokens/s, mean batch, forward passes
        rows: dict[str, list[tuple[float, float, float, int]]] = {"ceiling": [], "worker": []}
        if args.process:
            rows["engine process"] = []
        for _ in range(args.repeats):  # interleaved, so drifts hit both sides alike
            s, e, k, mb, fw = ceiling(engine, task_list, args.batch, sampling)
            rows["ceiling"].append((e / s, k / s, mb, fw))
            if args.process:  # the engine process called directly, one batch at a time
                s, e, k, mb, fw = ceiling(worker_engine, task_list, args.batch, sampling)
                rows["engine process"].append((e / s, k / s, mb, fw))
            s, e, k, mb, fw = worker_run(worker_engine, task_list, concurrency, sampling,
                                         root, setup.reward)
            rows["worker"].append((e / s, k / s, mb, fw))
    med = {name: tuple(statistics.median(r[i] for r in v) for i in range(4))
           for name, v in rows.items()}
    samples = task_list[0].n_samples
    episodes = len(task_list) * samples
    print(f"# rollout bench on {setup.label}: {len(task_list)} tasks x {samples} samples = "
          f"{episodes} episodes, engine batch {args.batch}, worker concurrency {concurrency}, "
          f"max {sampling['max_new_tokens']} new tokens, temperature "
          f"{sampling.get('temperature', 1.0)}, torch threads {args.threads}, "
          f"{'continuous' if args.continuous else 'static'} batching, median of "
          f"{args.repeats}\n")
    unit = "sequences per decoding step" if args.continuous else "requests per engine call"
    print(f"| | episodes/s | generated tokens/s | mean batch ({unit}) | forward passes |")
    print("|---|---:|---:|---:|---:|")
    for name, (eps, tps, mb, fw) in med.items():
        print(f"| {name} | {rate(eps)} | {rate(tps)} | {mb:.1f} | {fw:.0f} |")
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
