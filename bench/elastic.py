"""Elasticity live on this machine: the quickstart whose rollout is slowed on purpose (every
generate request waits first, ``rollout.engine.latency``, and each rollout process has
``--slots`` episode slots: an inference server of fixed capacity on a slow link), run with a
fixed pool of 1, a fixed pool of ``--max`` and the scaler between them. The wait follows
``--phases`` by the wall clock (every process and every arm sees the same phases): slow
requests (the trainer waits: the pool should grow), then fast ones (a full pool outruns the
trainer, slowed with one sequence per forward/backward: the pool should shrink), and again.

    python -m bench.elastic                          # warm-up once, then the three arms
    python -m bench.elastic --warm runs/quickstart   # reuse that run's warm model
    python -m bench.elastic --arms auto --plot docs/img/elastic-live.png

Each arm is `astraflow run examples/quickstart.yaml` from the same warm model for
``--seconds`` of RL (RL only: the warm-up is not repeated). The table: trainer steps,
trainer wait ratio (Σ wait / Σ (wait + busy) over the trainer's steps), rollout
process-seconds (the pool's size over the RL phase, from the scaler's decisions), steps per rollout process-minute, scale actions,
drained scale-downs with the episodes they finished or released, and the run's accounting
(unaccounted and trained_twice must be 0). The plot (auto arm): trainer wait ratio and
rollout process count over time.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.lib.arms import (
    ROOT,
    arm_config,
    astraflow_run,
    make_warm,
    read_yaml,
    warm_models,
    write_yaml,
)
from bench.lib.plots import pyplot, save_figure
from bench.lib.runlog import read_jsonl, read_summary

BASE = ROOT / "examples" / "quickstart.yaml"


def arm_sets(arm: str, args: argparse.Namespace) -> list[str]:
    """The --set overrides of one arm over the common ones."""
    common = [f"rollout.max_concurrent_episodes={args.slots}",
              f"rollout.engine.max_batch_size={args.slots}",
              f"rollout.engine.latency={{type: phases, phases: {phases(args.phases)}, "
              f"start: {time.time():.0f}}}",
              f"data.batch_size={args.batch}", f"trainer.micro_batch_tokens={args.micro}",
              f"data.max_staleness={args.staleness}", "launch.evaluate=false"]
    if arm == "auto":
        return [*common, "launch.rollout_workers=1", "scale.enabled=true",
                f"scale.pools.rollout.min_workers={args.min}",
                f"scale.pools.rollout.max_workers={args.max}",
                f"scale.report_every_steps={args.report_steps}",
                f"scale.report_every_s={args.report_s}", f"scale.min_window_s={args.window}",
                f"scale.cooldown_s={args.cooldown}", f"scale.up_cooldown_s={args.up_cooldown}",
                f"scale.confirm={args.confirm}"]
    n = int(arm.split("-")[1])
    return [*common, f"launch.rollout_workers={n}"]


def phases(spec: str) -> list[list[float]]:
    """"2.0:60,0.2:60" -> [[2.0, 60.0], [0.2, 60.0]]: wait 2 s for a minute, then 0.2 s."""
    return [[float(x) for x in part.split(":")] for part in spec.split(",")]


def process_seconds(start: float, end: float, initial: int,
                    decisions: Sequence[Mapping[str, Any]]
                    ) -> tuple[float, list[tuple[float, int]]]:
    """Rollout process-seconds over [start, end] and the count over time: ``initial``, then
    each action the scaler took (at its decision's time; a retired process drains a little
    longer, which this does not count)."""
    timeline: list[tuple[float, int]] = [(start, initial)]
    for d in decisions:
        if d["target"] != d["current"] and d.get("actuation", {}).get("ok", True):
            timeline.append((min(max(d["ts"], start), end), d["target"]))
    total = sum(c * (t1 - t0) for (t0, c), (t1, _) in zip(timeline, [*timeline[1:],
                                                                   (end, 0)], strict=True))
    return total, timeline


def drains(run_dir: Path, log: Path) -> list[dict[str, Any]]:
    """What each scaled-down rollout process did while draining: the roles the supervisor
    retired (``role rollout-N stopped (scale-down`` in `astraflow run`'s output) and the
    ``drained_*`` counts of the stats line `astraflow rollout` prints when it exits."""
    text = log.read_text(errors="replace") if log.exists() else ""
    out = []
    for role in dict.fromkeys(re.findall(r"role (rollout-\d+) stopped \(scale-down", text)):
        path = run_dir / "logs" / f"{role}.log"
        stats = [x for x in path.read_text(errors="replace").splitlines()
                 if x.startswith("tasks_taken=")] if path.exists() else []
        if stats:
            counts = dict(kv.split("=", 1) for kv in stats[-1].split())
            out.append({"role": role, **{k: int(v) for k, v in counts.items()
                                         if k.startswith("drained_")}})
    return out


def run_arm(arm: str, base: dict[str, Any], warm: Mapping[str, Path], args: argparse.Namespace
            ) -> dict[str, Any]:
    data = arm_config(base, [*args.sets, *arm_sets(arm, args)], warm, seconds=args.seconds,
                      latency=None, workflow="single_turn", latency_key="latency")
    run_dir = args.out / arm
    cfg = write_yaml(data, args.out / f"{arm}.yaml")
    t0 = time.monotonic()
    code = astraflow_run(cfg, run_dir, args.out / f"{arm}.log")
    print(f"[{arm}] exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
    summary = read_summary(run_dir)
    steps = [r for r in read_jsonl(run_dir / "trainer-default.jsonl")
             if "step" in r and "event" not in r]
    starts = [r["time"] for r in read_jsonl(run_dir / "trainer-default.jsonl")
              if r.get("event") == "start"]
    if not steps or not starts:
        return {"arm": arm, "error": f"no trainer steps; see {args.out / f'{arm}.log'}"}
    start, end = min(starts), steps[-1]["time"]
    decisions = read_jsonl(run_dir / "scaler.jsonl")
    initial = 1 if arm == "auto" else int(arm.split("-")[1])
    proc_s, timeline = process_seconds(start, end, initial, decisions)
    wait = sum(r.get("wait_s", 0.0) for r in steps)
    busy = sum(r.get("busy_s", 0.0) for r in steps)
    acc = summary.get("accounting", {})
    return {
        "arm": arm, "steps": len(steps), "seconds": end - start,
        "wait_ratio": wait / max(wait + busy, 1e-9),
        "process_s": proc_s, "steps_per_process_min": len(steps) / max(proc_s / 60.0, 1e-9),
        "ups": sum(1 for d in decisions if d["target"] > d["current"]),
        "downs": sum(1 for d in decisions if d["target"] < d["current"]),
        "drains": drains(run_dir, args.out / f"{arm}.log"), "unaccounted": acc.get("unaccounted"),
        "trained_twice": acc.get("trained_twice"),
        "timeline": timeline,
        "wait_curve": [(r["time"], r.get("wait_ratio", 0.0)) for r in steps],
        "start": start,
    }


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("| arm | trainer steps | RL s | trainer wait | rollout process-s | steps per "
            "process-min | scale up / down | drained (finished / released) | unaccounted | "
            "trained twice |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['arm']} | {r['error']} |")
            continue
        fin = sum(d.get("drained_finished", 0) for d in r["drains"])
        rel = sum(v for d in r["drains"] for k, v in d.items()
                  if k.startswith("drained_released"))
        lines.append(
            f"| {r['arm']} | {r['steps']} | {r['seconds']:.0f} | {r['wait_ratio']:.3f} | "
            f"{r['process_s']:.0f} | {r['steps_per_process_min']:.2f} | {r['ups']} / "
            f"{r['downs']} | {len(r['drains'])} ({fin} / {rel}) | {r['unaccounted']} | "
            f"{r['trained_twice']} |")
    return "\n".join(lines)


def plot(row: Mapping[str, Any], path: Path) -> Path | None:
    if "error" in row:
        return None
    plt = pyplot()
    t0 = row["start"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = [t - t0 for t, _ in row["wait_curve"]]
    ax.plot(xs, [w for _, w in row["wait_curve"]], color="tab:red", lw=1,
            label="trainer wait ratio (last 20 steps)")
    ax.set_xlabel("seconds of RL")
    ax.set_ylabel("trainer wait ratio")
    ax.set_ylim(0, 1.05)
    ax2 = ax.twinx()
    tl = row["timeline"]
    end = row["start"] + row["seconds"]
    ax2.step([t - t0 for t, _ in tl] + [end - t0], [c for _, c in tl] + [tl[-1][1]],
             where="post", color="tab:blue", label="rollout processes")
    ax2.set_ylabel("rollout processes")
    ax2.set_ylim(0, max(c for _, c in tl) + 1)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, loc="upper right", fontsize=8)
    ax.set_title("bench/elastic.py: the scaler on the slowed quickstart")
    return save_figure(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.elastic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="fixed-1,fixed-3,auto",
                    help="comma-separated: auto, fixed-N")
    ap.add_argument("--seconds", type=float, default=240.0, help="RL seconds per arm")
    ap.add_argument("--phases", default="2.0:60,0.2:60",
                    help="the latency each generate request waits, by the wall clock "
                         "(rollout.engine.latency of type phases): SECONDS:DURATION_S,...")
    ap.add_argument("--micro", type=int, default=16,
                    help="trainer.micro_batch_tokens: small = a slower trainer (one sequence "
                         "per forward/backward), so that a full pool outruns it")
    ap.add_argument("--slots", type=int, default=384, help="episode slots per rollout process")
    ap.add_argument("--batch", type=int, default=64, help="groups per training batch")
    ap.add_argument("--staleness", type=int, default=2, help="data.max_staleness")
    ap.add_argument("--min", type=int, default=1)
    ap.add_argument("--max", type=int, default=3)
    ap.add_argument("--report-steps", type=int, default=5)
    ap.add_argument("--report-s", type=float, default=15.0)
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--cooldown", type=float, default=20.0)
    ap.add_argument("--up-cooldown", type=float, default=5.0)
    ap.add_argument("--confirm", type=int, default=1)
    ap.add_argument("--warm", type=Path, default=None, help="a finished run of the "
                                                            "quickstart whose warm model to reuse")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-elastic")
    ap.add_argument("--plot", type=Path, default=None, help="PNG of the auto arm")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override for every arm (and the warm-up)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = read_yaml(BASE)
    warm = warm_models(args.warm or make_warm(base, args.sets, args.out))
    rows = [run_arm(a.strip(), base, warm, args) for a in args.arms.split(",") if a.strip()]
    print(table(rows))
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    auto = [r for r in rows if r["arm"] == "auto"]
    if args.plot and auto:
        print(f"plot: {plot(auto[0], args.plot)}")
    return exit_code(rows)


def exit_code(rows: Sequence[Mapping[str, Any]]) -> int:
    """1 when an arm failed or its accounting was not exact (said on stdout), else 0."""
    bad = [r["arm"] for r in rows if r.get("unaccounted") or r.get("trained_twice")]
    if bad:
        print(f"accounting NOT exact in: {', '.join(bad)}")
    return 1 if bad or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
