"""The quickstart as a benchmark: wall-clock of RL to reach a held-out accuracy threshold and
the trainer's wait ratio, for 1 vs 2 rollout processes, embedded vs Kafka, against a
synchronous single-process baseline (bench/sync_loop.py: generate, then train, alternating)
started from the same model in the same run.

    python -m bench.quickstart    # embedded-2, embedded-1, kafka-2, kafka-1, sync; 0.45; 300 s each
    python -m bench.quickstart --only embedded-2 sync   # a subset
    python -m bench.quickstart --only embedded-1 embedded-1p sync   # 1p: rollout.engine.process
    python -m bench.quickstart --threshold 0.35 --seconds 240 --out runs/bench-quickstart
    # a real model, no warm-up (SmolLM2-135M-Instruct on chain_sum; greedy starts near 0.41)
    python -m bench.quickstart --config examples/smollm2_chain_sum.yaml --only embedded-1 sync \
        --no-kafka --threshold 0.55 --seconds 900 --every 5
    python -m bench.quickstart ... --set rollout.engine.dtype=float32   # every arm overridden

With a config that warms up (``launch.warmup.steps`` > 0, the quickstart's), the first
pipeline run does the SFT warm-up; every other run (and the baseline) starts RL from that
run's warm model, so all of them start from the same weights. With one that does not, every
run and the baseline start from the config's model as it is. Each pipeline run is
`astraflow run CONFIG` with `launch.stop_at_accuracy` = the threshold, `launch.timeout_s` =
--seconds, `launch.eval_every` = --every and `launch.eval_samples` = 0 (the threshold is on
greedy accuracy, which is all the baseline measures: sampled evaluations would only take CPU
from the pipeline). Time to threshold of a pipeline run is the RL-phase time at which the
trainer published the first version the evaluator measured at or above the threshold (so the
evaluator's own lag is not charged; its start-up is: the roles load the model inside that
time); of the baseline, its training seconds until an evaluation (every --every steps, the
config's ``launch.eval_every`` by default, as for the pipeline's evaluator) reached it. The
pipeline's evaluator also measures a version the trainer leaves alone for a while (its
``VersionWatch``), so it may see more versions than every --every-th; the table lists the
versions each side measured. The async advantage is baseline time / pipeline time (> 1: the
pipeline is faster). Kafka runs start a local broker (`astraflow broker fetch` first);
--no-kafka leaves them out.

Results go to <out>/bench.json and a table. Timing noise on 2-core machines is large (2–3×
slow stretches happen): compare within one invocation, and repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.lib.arms import astraflow, cli_run_args, read_yaml, set_args, write_yaml
from bench.lib.report import or_dash
from bench.lib.runlog import read_jsonl, read_summary

ROOT = Path(__file__).resolve().parents[1]

PIPELINES = {  # name: (rollout workers, bus, engine in a process of its own)
    "embedded-2": (2, "embedded", False),
    "embedded-1": (1, "embedded", False),
    # launch.share_cores off: each role on its fixed threads (the split before cores were
    # shared), to measure what sharing gives in the same invocation
    "embedded-1-fixed": (1, "embedded", False),
    "embedded-2p": (2, "embedded", True),
    "embedded-1p": (1, "embedded", True),
    "kafka-2": (2, "kafka", False),
    "kafka-1": (1, "kafka", False),
}
DEFAULT = ["embedded-2", "embedded-1", "kafka-2", "kafka-1"]


def time_to_threshold(rows: list[dict[str, Any]], threshold: float) -> float | None:
    """RL seconds at which the trainer reached the first version evaluated ≥ threshold."""
    hit = next((r for r in rows if r.get("eval_accuracy", -1.0) >= threshold), None)
    if hit is None:
        return None
    version = hit["step"]
    reached = [r["elapsed"] for r in rows
               if "eval_accuracy" not in r and "wait_ratio" in r and r.get("step", -1) >= version]
    return min(reached) if reached else hit["elapsed"]


def steps_per_s(rows: list[dict[str, Any]]) -> float | None:
    """The trainer's steps per second over its reports of the RL phase."""
    steps = [r for r in rows if "wait_ratio" in r and "eval_accuracy" not in r]
    if len(steps) < 2 or steps[-1]["elapsed"] <= steps[0]["elapsed"]:
        return None
    return round((steps[-1]["step"] - steps[0]["step"])
                 / (steps[-1]["elapsed"] - steps[0]["elapsed"]), 2)


#: arms that differ from their tuple's run by config alone
ARM_SETS = {"embedded-1-fixed": ["launch.share_cores=false"]}


def run_pipeline(name: str, config: Path, out: Path, *, workers: int, bus: str,
                 threshold: float, seconds: float, warm: Path | None, every: int,
                 process: bool = False, seed: int | None = None) -> dict[str, Any]:
    args = cli_run_args(config, out, [
        f"launch.rollout_workers={workers}", *ARM_SETS.get(name, []),
        f"rollout.engine.process={str(process).lower()}", f"launch.stop_at_accuracy={threshold}",
        f"launch.timeout_s={seconds}", f"launch.eval_every={every}", "launch.eval_samples=0"])
    if seed is not None:  # the trainer's and the engines' seeds
        args += set_args([f"trainer.seed={seed}", f"rollout.engine.seed={seed}"])
    if bus != "embedded":  # a run name of its own: the broker outlives each run
        args += ["--bus", bus, *set_args([f"run=bench-{name}-{os.getpid()}"])]
    if warm is not None:
        args += set_args([f"models.default.path={warm}", "models.default.build=none",
                          "launch.warmup.steps=0"])
    print(f"[{name}] astraflow.cli.app {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    code = astraflow(args, out.parent / f"{name}.log")
    rows = read_jsonl(out / "metrics.jsonl")
    summary = read_summary(out)
    evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
    measured = [[r["step"], round(r["eval_accuracy"], 3)] for r in rows if "eval_accuracy" in r]
    result = {"name": name, "exit": code, "wall_s": round(time.monotonic() - t0, 1),
              "budget_s": seconds, "steps_per_s": steps_per_s(rows),
              "time_to_threshold_s": time_to_threshold(rows, threshold),
              "wait_ratio": summary.get("wait_ratio_mean"),
              "episodes_per_s": summary.get("episodes_per_s_mean"),
              "steps": summary.get("trainer_steps"),
              "eval_first": evals[0] if evals else None,
              "eval_last": evals[-1] if evals else None,
              "eval_best": max(evals) if evals else None, "evaluated": measured,
              "unaccounted": summary.get("accounting", {}).get("unaccounted"),
              # start-up: RL seconds to the first trained version; where each role's time went
              "first_version_s": summary.get("first_version_s"),
              "time": summary.get("time")}
    print(f"[{name}] {result}", flush=True)
    return result


def run_baseline(source: Path, *, threshold: float, seconds: float, every: int,
                 seed: int | None = None, out: Path | None = None) -> dict[str, Any]:
    """The synchronous loop from ``source``: a run directory whose warm-up ended, or a config
    without a warm-up (bench/sync_loop.py's ``start_point``)."""
    from bench.sync_loop import run_sync

    print(f"[sync] baseline from {source}, seed {seed}", flush=True)
    curve = run_sync(source, seconds=seconds, every=every, threshold=threshold,
                     threads=os.cpu_count() or 1, seed=seed, out=out,
                     log=lambda s: print(f"[sync] {s}", flush=True))
    hit = next((p for p in curve if p["eval_accuracy"] >= threshold), None)
    steps = curve[-1]["step"]
    return {"name": "sync", "exit": 0, "time_to_threshold_s": hit["time"] if hit else None,
            "budget_s": seconds,
            "steps_per_s": round(steps / curve[-1]["time"], 2) if curve[-1]["time"] else None,
            "wait_ratio": None, "steps": steps,
            "episodes_per_s": None, "eval_first": curve[0]["eval_accuracy"],
            "eval_last": curve[-1]["eval_accuracy"],
            "eval_best": max(p["eval_accuracy"] for p in curve),
            "evaluated": [[p["step"], round(p["eval_accuracy"], 3)] for p in curve],
            "curve": curve}


def with_overrides(config: Path, sets: list[str], dest: Path) -> Path:
    """``config`` with the ``--set`` overrides applied, written to ``dest``."""
    from astraflow.core.config import apply_overrides

    return write_yaml(apply_overrides(read_yaml(config), sets), dest)


def warm_model(run_dir: Path, policy: str = "default") -> Path:
    """The model ``run_dir``'s RL phase started from (its warm-up's export, or the model as
    configured when the warm-up kept step 0)."""
    from astraflow.run.warmup import start_models

    return start_models(run_dir)[policy]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quickstart", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-quickstart")
    ap.add_argument("--threshold", type=float, default=0.45)
    ap.add_argument("--seconds", type=float, default=300.0, help="RL budget of each run")
    ap.add_argument("--every", type=int, default=None,
                    help="evaluate every N versions: the baseline's evaluations and the "
                         "pipeline's launch.eval_every (default: the config's "
                         "launch.eval_every)")
    ap.add_argument("--only", nargs="*", default=None,
                    help=f"subset of {', '.join([*PIPELINES, 'sync'])}")
    ap.add_argument("--kafka", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every arm, the baseline included (e.g. "
                         "rollout.engine.dtype=float32)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every arm this many times, interleaved, and report medians")
    ap.add_argument("--warm", type=Path, default=None,
                    help="start every run from the model this earlier run directory's RL "
                         "phase started from (<dir>/models/default-warm after a warm-up) "
                         "instead of warming up")
    args = ap.parse_args()
    from astraflow.config import load_experiment

    config = load_experiment(args.config, args.sets)
    if args.sets:  # every arm runs the overridden config (the baseline reads a file)
        args.out.mkdir(parents=True, exist_ok=True)
        args.config = with_overrides(args.config, args.sets, args.out / args.config.name)
    warms = config.launch.warmup.steps > 0  # else every run starts from the config's model
    every = args.every or config.launch.eval_every
    names = args.only or [*DEFAULT, "sync"]
    if not args.kafka:
        names = [n for n in names if not n.startswith("kafka")]
    unknown = set(names) - {*PIPELINES, "sync"}
    if unknown:
        ap.error(f"unknown runs {sorted(unknown)}; choose from {[*PIPELINES, 'sync']}")
    args.out.mkdir(parents=True, exist_ok=True)
    broker = None
    results: list[dict[str, Any]] = []
    warm_dir: Path | None = args.warm  # the run whose warm model everything starts from
    try:
        for rep in range(args.repeats):  # interleaved, so that drifts hit every arm alike
            suffix = f"-r{rep + 1}" if args.repeats > 1 else ""
            for name in [n for n in PIPELINES if n in names]:
                workers, bus, process = PIPELINES[name]
                if bus == "kafka":
                    if broker is None:
                        from astraflow.core.broker import LocalBroker
                        from astraflow.core.broker.jars import fetch_jars

                        fetch_jars()
                        broker = LocalBroker(args.out / "kafka")
                        broker.start(timeout=120)
                    bus = f"kafka://{broker.bootstrap}"
                warm = warm_model(warm_dir) if warm_dir else None
                out = args.out / f"{name}{suffix}"
                res = run_pipeline(f"{name}{suffix}", args.config, out, workers=workers,
                                   bus=bus, threshold=args.threshold, seconds=args.seconds,
                                   warm=warm, every=every, process=process,
                                   seed=None if rep == 0 else rep)
                results.append(dict(res, arm=name, repeat=rep))
                if warm_dir is None and (out / "models" / "default-warm").exists():
                    warm_dir = out
            if "sync" in names:
                if warm_dir is None and warms:  # only the baseline asked for: warm up first
                    run_pipeline("warmup", args.config, args.out / "warmup", workers=1,
                                 bus="embedded", threshold=1.0, seconds=1.0, warm=None,
                                 every=every)
                    warm_dir = args.out / "warmup"
                # a seed per repeat: one seed is one draw of a noisy learning curve
                res = run_baseline(warm_dir or args.config, threshold=args.threshold,
                                   seconds=args.seconds, every=every,
                                   seed=None if rep == 0 else rep, out=args.out / "sync")
                results.append(dict(res, name=f"sync{suffix}", arm="sync", repeat=rep))
    finally:
        if broker is not None:
            broker.stop()
    for r in results:  # against the baseline of the same repeat
        sync = next((b for b in results if b["arm"] == "sync" and b["repeat"] == r["repeat"]),
                    None)
        if sync and r is not sync and r["time_to_threshold_s"] and sync["time_to_threshold_s"]:
            r["async_advantage"] = round(sync["time_to_threshold_s"] / r["time_to_threshold_s"],
                                         2)
    arms = summarise(results) if args.repeats > 1 else []
    (args.out / "bench.json").write_text(json.dumps(
        {"config": str(args.config), "threshold": args.threshold, "seconds": args.seconds,
         "every": every, "repeats": args.repeats, "results": results, "arms": arms}, indent=1))
    print(f"\n{args.config.name}: threshold {args.threshold} held-out accuracy, RL budget "
          f"{args.seconds:.0f} s each, evaluated every {every} versions, from the same "
          f"{'warm ' if warms or args.warm else ''}model")
    print(f"{'run':<15}{'to threshold s':>16}{'wait ratio':>12}{'episodes/s':>12}"
          f"{'steps':>8}{'steps/s':>9}{'first':>8}{'last':>8}{'best':>8}{'advantage':>11}")
    for r in results:
        print(f"{r['name']:<15}{or_dash(r['time_to_threshold_s'], '.1f'):>16}"
              f"{or_dash(r['wait_ratio'], '.2f'):>12}{or_dash(r['episodes_per_s'], '.0f'):>12}"
              f"{or_dash(r['steps'], '.0f'):>8}{or_dash(r.get('steps_per_s'), '.2f'):>9}"
              f"{or_dash(r['eval_first'], '.3f'):>8}{or_dash(r.get('eval_last'), '.3f'):>8}"
              f"{or_dash(r['eval_best'], '.3f'):>8}{or_dash(r.get('async_advantage'), '.2f'):>11}")
    for r in results:  # which versions each side measured: the resolution of its time
        print(f"  {r['name']} evaluated (version, accuracy): "
              f"{' '.join(f'{s:g}:{a:.3f}' for s, a in r.get('evaluated') or [])}")
        if r["eval_first"] is not None and r["eval_first"] >= args.threshold:
            print(f"  {r['name']} started at or above the threshold: raise --threshold")
    from astraflow.run.breakdown import describe

    for r in results:  # start-up and where every second went (astraflow run's summary)
        if r.get("first_version_s") is not None:
            print(f"  {r['name']} first trained version at {r['first_version_s']:.1f} s of RL")
        for role, row in (r.get("time") or {}).items():
            print(f"  {r['name']} {role}: {describe(row)}")
    if arms:
        print(f"\nover {args.repeats} repeats (median; a run that missed the threshold counts "
              f"as the budget, {args.seconds:.0f} s)")
        print(f"{'arm':<15}{'to threshold s':>16}{'steps/s':>9}{'sync / this':>13}"
              f"{'paired ratios':>28}")
        for a in arms:
            print(f"{a['arm']:<15}{or_dash(a['time_to_threshold_s'], '.1f'):>16}"
                  f"{or_dash(a['steps_per_s'], '.2f'):>9}{or_dash(a.get('advantage'), '.2f'):>13}"
                  f"{' '.join(or_dash(x, '.2f') for x in a.get('paired', [])):>28}")
    for r in results:  # the ratios last: the baseline's time to the threshold over each arm's
        if r["arm"] != "sync":
            print(f"ratio {r['name']}: sync / pipeline time to {args.threshold} = "
                  f"{or_dash(r.get('async_advantage'), '.2f')}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm over the repeats: median time to threshold (a miss counts as the budget),
    median steps/s, the ratio of the baseline's median to the arm's, and the paired ratios."""
    import statistics

    budget = max((r.get("budget_s") or 0.0) for r in results) or None
    out = []
    for arm in dict.fromkeys(r["arm"] for r in results):
        runs = [r for r in results if r["arm"] == arm]
        times = [r["time_to_threshold_s"] or budget for r in runs]
        rates = [r["steps_per_s"] for r in runs if r.get("steps_per_s")]
        out.append({"arm": arm, "time_to_threshold_s": statistics.median(
            t for t in times if t is not None) if any(times) else None,
            "steps_per_s": round(statistics.median(rates), 2) if rates else None,
            "paired": [r["async_advantage"] for r in runs if "async_advantage" in r]})
    sync = next((a for a in out if a["arm"] == "sync"), None)
    for a in out:
        if sync and a is not sync and a["time_to_threshold_s"] and sync["time_to_threshold_s"]:
            a["advantage"] = round(sync["time_to_threshold_s"] / a["time_to_threshold_s"], 2)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
