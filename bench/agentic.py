"""A tool-using agent with long-tail tool latency: the pipeline (`astraflow run`) against a
synchronous loop on the same model, task, tool and latency (issue 14), in one invocation.

    python bench/agentic.py                          # p99/p50 = 40 (p50 0.05 s, p99 2 s)
    python bench/agentic.py --ratios 1 10 40         # the curve of the ratio against the tail
    python bench/agentic.py --warm runs/agent-tools  # reuse that run's warm model
    python bench/agentic.py --seconds 60 --only sync

The task is examples/agent_tools.yaml: ``a*b=`` for two-digit a, b; the model calls
``<tool>mul(a,b)</tool>``, the tool answers after a latency drawn per call (p50 0.05 s and p99
``ratio`` × p50: lognormal, or fixed 0.05 s for ratio 1; seeded by task id, sample and turn, so
both arms wait the same draws), the model copies the result. Every arm starts RL from the
same warm model (the example's SFT warm-up, run once here unless --warm).

* ``pipeline-<ratio>``: ``astraflow run`` as a subprocess, RL only, launch.timeout_s =
  --seconds + --startup (its processes start inside that budget): producer, gate, 2 rollout
  workers (episodes wait on their tool concurrently while the engine decodes others), trainer,
  evaluator; the trainer trains whatever groups are ready (the example's staleness bound, 2).
* ``sync-<ratio>``: one process (bench/multimodel.py's ``Lockstep`` with one policy): each step
  launches the step's episodes (``data.batch_size`` tasks × ``producer.n_samples``)
  concurrently on an in-process hf engine, trains only when the last one has finished (the
  slowest tool wait of 256 episodes bounds every step), one ``rl_step``, weights into the
  engine. Evaluation every --every steps, off its clock.

Measured per arm: s/step; held-out accuracy (the episode run greedily, tool called for real,
no latency: the evaluator's ``episode`` kind) against steps and time; **time to --target**
(default: the warm model's accuracy + --gain). The ratios are sync over pipeline (> 1: the
pipeline is faster). Results: ``<out>/agentic.json`` and a markdown table. Timing noise on
2-core machines is large: compare within one invocation, and repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from multimodel import (  # noqa: E402
    Lockstep,
    astraflow_run,
    at_step,
    f,
    make_warm,
    pipeline_result,
    read_yaml,
    run_lockstep,
    warm_models,
    write_yaml,
)
from multimodel import (
    arm_config as multimodel_arm_config,
)

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = "multi_turn_tools"
P50 = 0.05


def latency(ratio: float, p50: float = P50) -> dict[str, Any]:
    """The tool latency with p99 = ``ratio`` × p50 (fixed p50 for ratio 1)."""
    if ratio <= 1:
        return {"type": "fixed", "seconds": p50}
    return {"type": "lognormal", "p50": p50, "p99": p50 * ratio}


def arm_config(base: Mapping[str, Any], overrides: Sequence[str], warm: Mapping[str, Path], *,
               seconds: float, tool_latency: Mapping[str, Any] | None) -> dict[str, Any]:
    """``base`` with --set ``overrides``, RL only from the ``warm`` models, launch.timeout_s =
    ``seconds``, the tool's latency set (or removed): bench/multimodel.py's arm config."""
    return multimodel_arm_config(base, overrides, warm, seconds=seconds, latency=tool_latency,
                                 workflow=WORKFLOW, latency_key="tool_latency")


def episode_accuracy(cfg: Any, engine: Any) -> float:
    """What the run's evaluator measures (kind ``episode``)."""
    from astraflow.consumers.evaluator import greedy_episode_accuracy, held_out

    engine.model.eval()
    return greedy_episode_accuracy(
        engine.model, engine.tokenizer, held_out(cfg.producer, cfg.launch.eval_problems),
        policy=cfg.policies[0], workflow=cfg.workflow(), workflow_kwargs=cfg.workflow_kwargs(),
        reward=cfg.rollout.reward, max_new_tokens=cfg.rollout.engine.max_new_tokens,
        temperature=cfg.launch.eval_temperature)


class SyncLoop(Lockstep):
    """The synchronous loop: :class:`Lockstep` with one policy, measured by its episodes."""

    def accuracy(self) -> dict[str, float]:
        acc = round(episode_accuracy(self.cfg, self.engines[self.cfg.policies[0]]), 4)
        return {"accuracy": acc, "system_accuracy": acc}

    def evaluate(self) -> dict[str, float]:
        return {"accuracy": self.accuracy()["accuracy"]}


def run_pipeline(name: str, cfg_path: Path, out: Path, *, target: float | None) -> dict[str, Any]:
    from astraflow.config import load_experiment

    cfg = load_experiment(cfg_path)
    launched = time.time()
    code = astraflow_run(cfg_path, out, out.parent / f"{name}.log")
    res = {"exit": code, "wall_s": round(time.time() - launched, 1),
           **pipeline_result(out, cfg.policies, cfg.policies[0], target)}
    if "t0" in res:
        res["startup_s"] = round(res.pop("t0") - launched, 1)
    res["curve"] = res.pop("solver_curve", [])
    return res


def mean_accuracy(curve: Sequence[Mapping[str, float]], last: int) -> float | None:
    """Mean of the evaluations at steps 1..``last``: accuracy per trainer step over a range,
    less noisy than one evaluation (each is a sample of the held-out problems)."""
    points = [c["accuracy"] for c in curve if 0 < c["step"] <= last]
    return sum(points) / len(points) if points else None


def report(results: Mapping[str, Mapping[str, Any]], ratios: Sequence[float],
           target: float | None) -> tuple[str, list[dict[str, Any]]]:
    done = {k: r for k, r in results.items() if r.get("iterations")}
    common = min((r["iterations"] for r in done.values()), default=0)
    lines = [f"| arm | tool latency p99/p50 | s/step | steps | accuracy start → end | "
             f"accuracy @ step {common} | mean accuracy, steps 1–{common} | "
             f"time to {f(target, '.2f')} (s) |", "|" + "---|" * 8]
    for name, r in results.items():
        curve = r.get("curve") or []
        lines.append(
            f"| {name} | {r.get('ratio', '-')} | {f(r.get('s_per_iter'), '.3f')} | "
            f"{r.get('iterations', '-')} | {f(curve[0]['accuracy'] if curve else None)} → "
            f"{f(curve[-1]['accuracy'] if curve else None)} | {f(at_step(curve, common))} | "
            f"{f(mean_accuracy(curve, common))} | {f(r.get('time_to_target_s'), '.1f')} |")
    rows = []
    for ratio in ratios:
        p, s = results.get(f"pipeline-{ratio:g}", {}), results.get(f"sync-{ratio:g}", {})
        row: dict[str, Any] = {"ratio": ratio}
        if p.get("s_per_iter") and s.get("s_per_iter"):
            row["step_time_ratio"] = round(s["s_per_iter"] / p["s_per_iter"], 2)
        if p.get("time_to_target_s") and s.get("time_to_target_s"):
            row["time_to_target_ratio"] = round(s["time_to_target_s"] / p["time_to_target_s"], 2)
        rows.append(row)
    lines += ["", "| p99/p50 | sync / pipeline s/step | sync / pipeline time to target |",
              "|---|---|---|"]
    lines += [f"| {r['ratio']:g} | {f(r.get('step_time_ratio'), '.2f')} | "
              f"{f(r.get('time_to_target_ratio'), '.2f')} |" for r in rows]
    return "\n".join(lines), rows


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """The ratio curve: sync / pipeline (s/step and time to target) against p99/p50."""
    pts = [r for r in rows if r.get("step_time_ratio") is not None]
    if len(pts) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([r["ratio"] for r in pts], [r["step_time_ratio"] for r in pts], "o-",
            label="s/step")
    tt = [r for r in pts if r.get("time_to_target_ratio") is not None]
    if tt:
        ax.plot([r["ratio"] for r in tt], [r["time_to_target_ratio"] for r in tt], "s--",
                label="time to target")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("tool latency p99 / p50 (p50 0.05 s)")
    ax.set_ylabel("sync / pipeline")
    ax.set_title("agent_tools: pipeline speed-up over a synchronous loop")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "agent_tools.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-agentic")
    ap.add_argument("--seconds", type=float, default=90.0, help="RL budget of each arm")
    ap.add_argument("--startup", type=float, default=25.0,
                    help="pipeline: seconds added to launch.timeout_s for its processes")
    ap.add_argument("--ratios", type=float, nargs="+", default=[40.0],
                    help="tool latency p99/p50 of each pair of arms (p50 0.05 s)")
    ap.add_argument("--every", type=int, default=5, help="sync: evaluate every N steps")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--gain", type=float, default=0.15,
                    help="without --target: the target is this much above the warm model")
    ap.add_argument("--only", nargs="*", choices=["pipeline", "sync"], default=None)
    ap.add_argument("--warm", type=Path, default=None,
                    help="start from the model RL started from in this finished run")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override for every arm (and the warm-up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="sync: torch threads")
    args = ap.parse_args()
    kinds = args.only or ["pipeline", "sync"]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base = read_yaml(args.config)
    warm = warm_models(args.warm or make_warm(base, args.sets, args.out))
    print(f"warm model: {', '.join(f'{p}={m}' for p, m in warm.items())}", flush=True)
    from astraflow.config import ExperimentConfig
    from astraflow.consumers.rollout.service import build_engines

    target = args.target
    if target is None:
        cfg = ExperimentConfig.model_validate(arm_config(base, args.sets, warm, seconds=1.0,
                                                         tool_latency=None))
        from astraflow.models.config import ModelConfig

        engines = build_engines(cfg.rollout, policies=cfg.policies,
                                models={p: ModelConfig(path=str(m)) for p, m in warm.items()})
        start = episode_accuracy(cfg, engines[cfg.policies[0]])
        target = round(start + args.gain, 3)
        print(f"warm accuracy {start:.3f}; target {target:.3f}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for ratio in args.ratios:
        lat = latency(ratio)
        for kind in kinds:
            name = f"{kind}-{ratio:g}"
            t0 = time.monotonic()
            print(f"[{name}] tool latency {lat}", flush=True)
            if kind == "pipeline":
                data = arm_config(base, args.sets, warm, seconds=args.seconds + args.startup,
                                  tool_latency=lat)
                path = write_yaml(data, args.out / f"{name}.yaml")
                res = run_pipeline(name, path, args.out / name, target=target)
            else:
                data = arm_config(base, args.sets, warm, seconds=args.seconds, tool_latency=lat)
                cfg = ExperimentConfig.model_validate(data)
                res = run_lockstep(cfg, warm, seconds=args.seconds, every=args.every,
                                   target=target, threads=args.threads, final_eval=False,
                                   loop_class=SyncLoop,
                                   log=lambda s, n=name: print(f"  [{n}] {s}", flush=True))
                res["curve"] = res.pop("solver_curve")
                res.pop("system_curve", None)
            res["ratio"] = ratio
            results[name] = res
            print(f"[{name}] done in {time.monotonic() - t0:.0f} s: s/step "
                  f"{f(res.get('s_per_iter'), '.3f')}, steps {res.get('iterations')}, "
                  f"time to target {f(res.get('time_to_target_s'), '.1f')}", flush=True)
            (args.out / "agentic.json").write_text(json.dumps(
                {"target": target, "results": results}, indent=1, default=str))
    table, rows = report(results, args.ratios, target)
    (args.out / "agentic.json").write_text(json.dumps(
        {"target": target, "results": results, "ratios": rows}, indent=1, default=str))
    print(table)
    png = plot(rows, args.out / "ratio.png")
    if png is not None:
        print(f"ratio curve: {png}")
    print(f"\n{len(results)} arms in {time.monotonic() - started:.0f} s; results: "
          f"{args.out / 'agentic.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
