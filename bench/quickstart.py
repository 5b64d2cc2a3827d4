"""The quickstart as a benchmark: wall-clock of RL to reach a held-out accuracy threshold and
the trainer's wait ratio, for 1 vs 2 rollout processes, embedded vs Kafka, against a
synchronous single-process baseline (bench/sync_loop.py: generate, then train, alternating)
started from the same warm model in the same run.

    python bench/quickstart.py                          # all five, threshold 0.45, 300 s each
    python bench/quickstart.py --only embedded-2 sync   # a subset
    python bench/quickstart.py --threshold 0.35 --seconds 240 --out runs/bench-quickstart

The first pipeline run does the SFT warm-up; every other run (and the baseline) starts RL
from that run's warm model, so all of them start from the same weights. Each pipeline run is
`astraflow run examples/quickstart.yaml` with `launch.stop_at_accuracy` = the threshold and
`launch.timeout_s` = --seconds. Time to threshold of a pipeline run is the RL-phase time at
which the trainer published the first version the evaluator measured at or above the
threshold (so the evaluator's own lag is not charged); of the baseline, its training seconds
until an evaluation (every --every steps) reached it. The async advantage is
baseline time / pipeline time (> 1: the pipeline is faster). Kafka runs start a local broker
(`astraflow broker fetch` first); --no-kafka leaves them out.

Results go to <out>/bench.json and a table. Timing noise on 2-core machines is large (2–3×
slow stretches happen): compare within one invocation, and repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PIPELINES = {  # name: (rollout workers, bus)
    "embedded-2": (2, "embedded"),
    "embedded-1": (1, "embedded"),
    "kafka-2": (2, "kafka"),
    "kafka-1": (1, "kafka"),
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def time_to_threshold(rows: list[dict[str, Any]], threshold: float) -> float | None:
    """RL seconds at which the trainer reached the first version evaluated ≥ threshold."""
    hit = next((r for r in rows if r.get("eval_accuracy", -1.0) >= threshold), None)
    if hit is None:
        return None
    version = hit["step"]
    reached = [r["elapsed"] for r in rows
               if "eval_accuracy" not in r and "wait_ratio" in r and r.get("step", -1) >= version]
    return min(reached) if reached else hit["elapsed"]


def run_pipeline(name: str, config: Path, out: Path, *, workers: int, bus: str,
                 threshold: float, seconds: float, warm: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "astraflow.cli.app", "run", str(config), "--out", str(out),
           "--no-live", "--set", f"launch.rollout_workers={workers}",
           "--set", f"launch.stop_at_accuracy={threshold}",
           "--set", f"launch.timeout_s={seconds}"]
    if bus != "embedded":  # a run name of its own: the broker outlives each run
        cmd += ["--bus", bus, "--set", f"run=bench-{name}-{os.getpid()}"]
    if warm is not None:
        cmd += ["--set", f"models.default.path={warm}", "--set", "models.default.build=none",
                "--set", "launch.warmup.steps=0"]
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    t0 = time.monotonic()
    with open(out.parent / f"{name}.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    rows = read_jsonl(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text()) if (
        out / "summary.json").exists() else {}
    evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
    result = {"name": name, "exit": code, "wall_s": round(time.monotonic() - t0, 1),
              "time_to_threshold_s": time_to_threshold(rows, threshold),
              "wait_ratio": summary.get("wait_ratio_mean"),
              "episodes_per_s": summary.get("episodes_per_s_mean"),
              "steps": summary.get("trainer_steps"),
              "eval_first": evals[0] if evals else None,
              "eval_best": max(evals) if evals else None,
              "unaccounted": summary.get("accounting", {}).get("unaccounted")}
    print(f"[{name}] {result}", flush=True)
    return result


def run_baseline(run_dir: Path, *, threshold: float, seconds: float, every: int
                 ) -> dict[str, Any]:
    from sync_loop import run_sync

    print(f"[sync] baseline from {run_dir / 'models'}", flush=True)
    curve = run_sync(run_dir, seconds=seconds, every=every, threshold=threshold,
                     threads=os.cpu_count() or 1, log=lambda s: print(f"[sync] {s}", flush=True))
    hit = next((p for p in curve if p["eval_accuracy"] >= threshold), None)
    steps = curve[-1]["step"]
    return {"name": "sync", "exit": 0, "time_to_threshold_s": hit["time"] if hit else None,
            "wait_ratio": None, "steps": steps,
            "episodes_per_s": None, "eval_first": curve[0]["eval_accuracy"],
            "eval_best": max(p["eval_accuracy"] for p in curve), "curve": curve}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-quickstart")
    ap.add_argument("--threshold", type=float, default=0.45)
    ap.add_argument("--seconds", type=float, default=300.0, help="RL budget of each run")
    ap.add_argument("--every", type=int, default=10, help="baseline: evaluate every N steps")
    ap.add_argument("--only", nargs="*", default=None,
                    help=f"subset of {', '.join([*PIPELINES, 'sync'])}")
    ap.add_argument("--kafka", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--warm", type=Path, default=None,
                    help="start every run from this earlier run directory's warm model "
                         "(<dir>/models/default-warm) instead of warming up")
    args = ap.parse_args()
    names = args.only or [*PIPELINES, "sync"]
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
        for name in [n for n in PIPELINES if n in names]:
            workers, bus = PIPELINES[name]
            if bus == "kafka":
                if broker is None:
                    from astraflow.core.broker import LocalBroker
                    from astraflow.core.broker.jars import fetch_jars

                    fetch_jars()
                    broker = LocalBroker(args.out / "kafka")
                    broker.start(timeout=120)
                bus = f"kafka://{broker.bootstrap}"
            warm = warm_dir / "models" / "default-warm" if warm_dir else None
            res = run_pipeline(name, args.config, args.out / name, workers=workers, bus=bus,
                               threshold=args.threshold, seconds=args.seconds, warm=warm)
            results.append(res)
            if warm_dir is None and (args.out / name / "models" / "default-warm").exists():
                warm_dir = args.out / name
        if "sync" in names:
            if warm_dir is None:  # only the baseline asked for: make the warm model first
                res = run_pipeline("warmup", args.config, args.out / "warmup", workers=1,
                                   bus="embedded", threshold=1.0, seconds=1.0, warm=None)
                warm_dir = args.out / "warmup"
            results.append(run_baseline(warm_dir, threshold=args.threshold,
                                        seconds=args.seconds, every=args.every))
    finally:
        if broker is not None:
            broker.stop()
    sync = next((r for r in results if r["name"] == "sync"), None)
    for r in results:
        if sync and r is not sync and r["time_to_threshold_s"] and sync["time_to_threshold_s"]:
            r["async_advantage"] = round(sync["time_to_threshold_s"] / r["time_to_threshold_s"],
                                         2)
    (args.out / "bench.json").write_text(json.dumps(
        {"threshold": args.threshold, "seconds": args.seconds, "results": results}, indent=1))
    print(f"\nthreshold {args.threshold} held-out accuracy, RL budget {args.seconds:.0f} s "
          f"each, from the same warm model")
    print(f"{'run':<12}{'to threshold s':>16}{'wait ratio':>12}{'episodes/s':>12}"
          f"{'steps':>8}{'first':>8}{'best':>8}{'advantage':>11}")
    def f(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    for r in results:
        print(f"{r['name']:<12}{f(r['time_to_threshold_s'], '.1f'):>16}"
              f"{f(r['wait_ratio']):>12}{f(r['episodes_per_s'], '.0f'):>12}"
              f"{f(r['steps'], '.0f'):>8}{f(r['eval_first'], '.3f'):>8}"
              f"{f(r['eval_best'], '.3f'):>8}{f(r.get('async_advantage')):>11}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
