"""A tool-using agent with long-tail tool latency: the pipeline (`astraflow run`) against a
synchronous loop on the same model, task, tool and latency, in one invocation.

    python -m bench.agentic                          # p99/p50 = 40 (p50 0.05 s, p99 2 s)
    python -m bench.agentic --ratios 1 10 40         # the curve of the ratio against the tail
    python -m bench.agentic --p50 1                  # a slower tool: p50 1 s, p99 40 s
    python -m bench.agentic --warm runs/agent-tools  # reuse that run's warm model
    python -m bench.agentic --seconds 60 --only sync
    python -m bench.agentic --repeats 3                # interleaved; medians, per-step means
    python -m bench.agentic --from A/agentic.json B/agentic.json   # summarise earlier runs

The task is examples/agent_tools.yaml (the tiny model) or, with ``--config
examples/smollm2_tools.yaml``, the same on SmolLM2-135M-Instruct: ``a*b=`` for two-digit a, b;
the model calls ``<tool>mul(a,b)</tool>``, the tool answers after a latency drawn per call (p50
--p50, 0.05 s by default, and p99 ``ratio`` × p50: lognormal, or fixed p50 for ratio 1; seeded
by task id, sample and turn, so both arms wait the same draws), the model copies the result.
Every arm starts RL from the same warm model (the example's SFT warm-up, run once here unless
--warm).

* ``pipeline-<ratio>``: ``astraflow run`` as a subprocess, RL only, launch.timeout_s =
  --seconds + --startup (its processes start inside that budget): producer, gate, 2 rollout
  workers (episodes wait on their tool concurrently while the engine decodes others), trainer,
  evaluator; the trainer trains whatever groups are ready (the example's staleness bound, 2).
* ``sync-<ratio>``: one process (bench/multimodel.py's ``Lockstep`` with one policy): each step
  launches the step's episodes (``data.batch_size`` tasks × ``producer.n_samples``)
  concurrently on an in-process hf engine, trains only when the last one has finished (the
  slowest tool wait of 256 episodes bounds every step), one ``rl_step``, weights into the
  engine. Evaluation every --every steps, off its clock.
* ``delayed<D>-<ratio>`` (with ``--sync-delay D``): the same loop, but each step trains on the
  episodes generated D versions earlier (the first step generates D + 1 batches): the
  pipeline's staleness without the pipeline (same loss, its behaviour weights correcting), to
  tell what staleness itself costs per step from what the pipeline's mechanics cost.

Measured per arm: s/step; held-out accuracy (the episode run greedily, tool called for real,
no latency: the evaluator's ``episode`` kind) against steps and time; **time to --target**
(default: the warm model's accuracy + --gain). The ratios are sync over pipeline (> 1: the
pipeline is faster). Results: ``<out>/agentic.json`` and a markdown table. Timing noise on
2-core machines is large: compare within one invocation, and repeat.

**Accuracy per trainer step**, over several runs of each arm (``--repeats``, or ``--from`` the
``agentic.json`` of earlier invocations): each run's evaluations at steps 10, 20, …,
--per-step-until are averaged (the pipeline evaluates every 10 versions, the loop every
--every steps; both at those; a run that stopped before that step counts in the times only),
and so are its training rewards over the same steps; the summary gives their mean ±
standard error over the runs, the pipeline's difference to the loop (± its standard error),
median time and steps to the target, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.lib import arms
from bench.lib.arms import make_warm, read_yaml, warm_models, write_yaml
from bench.lib.plots import pyplot, save_figure
from bench.lib.report import or_dash
from bench.multimodel import Lockstep, at_step, launch_pipeline, mean_upto, run_lockstep

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
    ``seconds``, the tool's latency set (or removed): bench/lib/arms.py's arm config."""
    return arms.arm_config(base, overrides, warm, seconds=seconds, latency=tool_latency,
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
    _, res = launch_pipeline(name, cfg_path, out, target=target,
                             solver=lambda cfg: cfg.policies[0])
    res["curve"] = res.pop("solver_curve", [])
    return res


def steps_to(curve: Sequence[Mapping[str, float]], target: float | None) -> int | None:
    """The first evaluated step at or above ``target``."""
    return next((int(c["step"]) for c in curve if target is not None and c["step"] > 0
                 and c["accuracy"] >= target), None)


def result_train_rewards(res: Mapping[str, Any]) -> list[float]:
    """Mean training reward of each trainer step, from an arm's result (its ``rows``: the
    pipeline's trainer log rows by policy, or the loop's rows; not a run directory's log, as
    :func:`bench.lib.runlog.train_rewards` reads)."""
    rows = res.get("rows") or []
    if isinstance(rows, Mapping):  # the pipeline's: by policy
        rows = next(iter(rows.values()), [])
    return [r["reward_mean"] if "reward_mean" in r else r.get("default_reward", 0.0)
            for r in rows]


def arm_kind(name: str) -> str:
    """``pipeline-40-r2`` -> ``pipeline-40``: the arm without its repeat."""
    return re.sub(r"-r\d+$", "", name)


def per_step(runs: Sequence[tuple[str, Mapping[str, Any]]], target: float | None,
             until: int = 60) -> tuple[str, list[dict[str, Any]]]:
    """Accuracy per trainer step and time to target over the runs of each arm kind; see the
    module docstring. ``runs``: (arm name, its result)."""

    def mean_se(xs: Sequence[float]) -> tuple[float | None, float | None]:
        if not xs:
            return None, None
        se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None
        return statistics.fmean(xs), se

    grid = list(range(10, until + 1, 10))
    kinds: dict[str, dict[str, Any]] = {}
    for name, r in runs:
        k = kinds.setdefault(arm_kind(name), {"acc": [], "reward": [], "time": [], "steps": [],
                                              "s_step": []})
        curve = r.get("curve") or []
        if grid and curve and curve[-1]["step"] >= grid[-1]:  # shorter runs: time only
            k["acc"].append(statistics.fmean(at_step(curve, g) or 0.0 for g in grid))
            rew = result_train_rewards(r)[:grid[-1]]
            if rew:
                k["reward"].append(statistics.fmean(rew))
        k["time"].append(r.get("time_to_target_s"))
        k["steps"].append(steps_to(curve, target))
        k["s_step"].append(r.get("s_per_iter"))
    rows = []
    for kind, k in kinds.items():
        acc, acc_se = mean_se(k["acc"])
        rew, rew_se = mean_se(k["reward"])
        times = [t for t in k["time"] if t is not None]
        steps = [s for s in k["steps"] if s is not None]
        rates = [s for s in k["s_step"] if s]
        rows.append({"arm": kind, "runs": len(k["acc"]), "acc": acc, "acc_se": acc_se,
                     "acc_runs": k["acc"], "reward": rew, "reward_se": rew_se,
                     "time": statistics.median(times) if times else None,
                     "times": k["time"], "reached": f"{len(times)}/{len(k['time'])}",
                     "steps": statistics.median(steps) if steps else None,
                     "s_step": statistics.median(rates) if rates else None})
    sync = {r["arm"].split("-", 1)[1]: r for r in rows if r["arm"].startswith("sync-")}
    for r in rows:
        base = sync.get(r["arm"].split("-", 1)[1])
        if base is None or base is r or r["acc"] is None or base["acc"] is None:
            continue
        r["acc_diff"] = r["acc"] - base["acc"]
        ses = [x for x in (r["acc_se"], base["acc_se"]) if x is not None]
        r["acc_diff_se"] = sum(x * x for x in ses) ** 0.5 if len(ses) == 2 else None
        if r["time"] and base["time"]:
            r["time_ratio"] = base["time"] / r["time"]
    steps_label = f"{grid[0]}–{grid[-1]}" if grid else "-"

    def pm(v: float | None, se: float | None) -> str:
        return or_dash(v, '.3f') + ("" if se is None else f" ± {se:.3f}")

    lines = [f"| arm | runs (to step {grid[-1] if grid else '-'}) | s/step (median) | "
             f"time to {or_dash(target, '.2f')} (s, median; each) | steps to it (median) | "
             f"mean accuracy, steps {steps_label} | its difference to the loop | "
             f"mean train reward, same steps | sync / this time |",
             "|" + "---|" * 9]
    for r in rows:
        each = ", ".join(or_dash(t, ".1f") for t in r["times"])
        lines.append(
            f"| {r['arm']} | {len(r['times'])} ({r['runs']}) | {or_dash(r['s_step'], '.3f')} | "
            f"{or_dash(r['time'], '.1f')} ({each}; reached {r['reached']}) | "
            f"{or_dash(r['steps'], '.0f')} | "
            f"{pm(r['acc'], r['acc_se'])} | {pm(r.get('acc_diff'), r.get('acc_diff_se'))} | "
            f"{pm(r['reward'], r['reward_se'])} | {or_dash(r.get('time_ratio'), '.2f')} |")
    return "\n".join(lines), rows


def report(results: Mapping[str, Mapping[str, Any]], ratios: Sequence[float],
           target: float | None) -> tuple[str, list[dict[str, Any]]]:
    done = {k: r for k, r in results.items() if r.get("iterations")}
    common = min((r["iterations"] for r in done.values()), default=0)
    lines = [f"| arm | tool latency p99/p50 | s/step | steps | accuracy start → end | "
             f"accuracy @ step {common} | mean accuracy, steps 1–{common} | "
             f"time to {or_dash(target, '.2f')} (s) |", "|" + "---|" * 8]
    for name, r in results.items():
        curve = r.get("curve") or []
        lines.append(
            f"| {name} | {r.get('ratio', '-')} | {or_dash(r.get('s_per_iter'), '.3f')} | "
            f"{r.get('iterations', '-')} | "
            f"{or_dash(curve[0]['accuracy'] if curve else None, '.3f')} → "
            f"{or_dash(curve[-1]['accuracy'] if curve else None, '.3f')} | "
            f"{or_dash(at_step(curve, common), '.3f')} | "
            f"{or_dash(mean_upto(curve, common), '.3f')} | "
            f"{or_dash(r.get('time_to_target_s'), '.1f')} |")

    def median(kind: str, key: str) -> float | None:
        """The median of ``key`` over the runs of an arm kind (one run: its value)."""
        xs = [r[key] for n, r in results.items() if arm_kind(n) == kind and r.get(key)]
        return statistics.median(xs) if xs else None

    rows = []
    for ratio in ratios:
        row: dict[str, Any] = {"ratio": ratio}
        for key, out in (("s_per_iter", "step_time_ratio"),
                         ("time_to_target_s", "time_to_target_ratio")):
            p, s = median(f"pipeline-{ratio:g}", key), median(f"sync-{ratio:g}", key)
            if p and s:
                row[out] = round(s / p, 2)
        rows.append(row)
    lines += ["", "| p99/p50 | sync / pipeline s/step | sync / pipeline time to target |",
              "|---|---|---|"]
    lines += [f"| {r['ratio']:g} | {or_dash(r.get('step_time_ratio'), '.2f')} | "
              f"{or_dash(r.get('time_to_target_ratio'), '.2f')} |" for r in rows]
    return "\n".join(lines), rows


def plot(rows: Sequence[Mapping[str, Any]], path: Path, p50: float = P50) -> Path | None:
    """The ratio curve: sync / pipeline (s/step and time to target) against p99/p50."""
    pts = [r for r in rows if r.get("step_time_ratio") is not None]
    if len(pts) < 2:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([r["ratio"] for r in pts], [r["step_time_ratio"] for r in pts], "o-",
            label="s/step")
    tt = [r for r in pts if r.get("time_to_target_ratio") is not None]
    if tt:
        ax.plot([r["ratio"] for r in tt], [r["time_to_target_ratio"] for r in tt], "s--",
                label="time to target")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"tool latency p99 / p50 (p50 {p50:g} s)")
    ax.set_ylabel("sync / pipeline")
    ax.set_title("agent_tools: pipeline speed-up over a synchronous loop")
    ax.legend()
    return save_figure(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agentic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "agent_tools.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-agentic")
    ap.add_argument("--seconds", type=float, default=90.0, help="RL budget of each arm")
    ap.add_argument("--startup", type=float, default=25.0,
                    help="pipeline: seconds added to launch.timeout_s for its processes")
    ap.add_argument("--ratios", type=float, nargs="+", default=[40.0],
                    help="tool latency p99/p50 of each pair of arms (p50: --p50)")
    ap.add_argument("--p50", type=float, default=P50,
                    help=f"the tool latency's median in seconds (default {P50:g})")
    ap.add_argument("--every", type=int, default=5, help="sync: evaluate every N steps")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--gain", type=float, default=0.15,
                    help="without --target: the target is this much above the warm model")
    ap.add_argument("--only", nargs="*", choices=["pipeline", "sync", "delayed"], default=None)
    ap.add_argument("--sync-delay", type=int, default=0,
                    help="add the arm delayed<D>-<ratio>: the synchronous loop trained on the "
                         "episodes of D versions earlier (staleness without the pipeline)")
    ap.add_argument("--warm", type=Path, default=None,
                    help="start from the model RL started from in this finished run")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override for every arm (and the warm-up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="sync: torch threads")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every arm this many times, interleaved (arms named NAME-rK)")
    ap.add_argument("--per-step-until", type=int, default=60,
                    help="accuracy per step: average the evaluations up to this step")
    ap.add_argument("--from", dest="sources", nargs="+", default=None,
                    metavar="FILE[:ARM,...]",
                    help="run nothing: summarise the agentic.json of earlier invocations "
                         "(their arms pooled by name, or only the arms named after ':'; the "
                         "first one's target)")
    args = ap.parse_args()
    if args.sources:
        return main_from(args.sources, until=args.per_step_until)
    kinds = args.only or ["pipeline", "sync"] + (["delayed"] if args.sync_delay else [])
    if "delayed" in kinds and args.sync_delay < 1:
        ap.error("the delayed arm needs --sync-delay D (D >= 1)")
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
    for rep, ratio, kind in ((r, ratio, kind) for r in range(args.repeats)
                             for ratio in args.ratios for kind in kinds):
        lat = latency(ratio, args.p50)
        label = f"delayed{args.sync_delay}" if kind == "delayed" else kind
        name = f"{label}-{ratio:g}" + (f"-r{rep + 1}" if args.repeats > 1 else "")
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
                               delay=args.sync_delay if kind == "delayed" else 0,
                               log=lambda s, n=name: print(f"  [{n}] {s}", flush=True))
            res["curve"] = res.pop("solver_curve")
            res.pop("system_curve", None)
        res["ratio"] = ratio
        results[name] = res
        print(f"[{name}] done in {time.monotonic() - t0:.0f} s: s/step "
              f"{or_dash(res.get('s_per_iter'), '.3f')}, steps {res.get('iterations')}, "
              f"time to target {or_dash(res.get('time_to_target_s'), '.1f')}", flush=True)
        (args.out / "agentic.json").write_text(json.dumps(
            {"target": target, "p50": args.p50, "results": results}, indent=1, default=str))
    table, rows = report(results, args.ratios, target)
    steps_table, steps_rows = per_step(list(results.items()), target, args.per_step_until)
    (args.out / "agentic.json").write_text(json.dumps(
        {"target": target, "p50": args.p50, "results": results, "ratios": rows,
         "per_step": steps_rows},
        indent=1, default=str))
    print(table)
    print(f"\n{steps_table}")
    png = plot(rows, args.out / "ratio.png", args.p50)
    if png is not None:
        print(f"ratio curve: {png}")
    print(f"\n{len(results)} arms in {time.monotonic() - started:.0f} s; results: "
          f"{args.out / 'agentic.json'}")
    for r in rows:  # the ratios last
        print(f"ratio, tool latency p99/p50 {r['ratio']:g} (p50 {args.p50:g} s): sync / pipeline "
              f"s/step {or_dash(r.get('step_time_ratio'), '.2f')}, "
              f"time to {or_dash(target, '.2f')} "
              f"{or_dash(r.get('time_to_target_ratio'), '.2f')}")
    return 0


def main_from(sources: Sequence[str], *, until: int) -> int:
    """``--from``: the per-step summary over the arms of earlier invocations' agentic.json
    (``FILE:ARM,ARM`` takes only those arms; an arm name met again is numbered on:
    ``pipeline-40-r2``)."""
    runs: list[tuple[str, Mapping[str, Any]]] = []
    target = None
    for source in sources:
        file, _, arms = source.partition(":")
        path = Path(file)
        data = json.loads(path.read_text())
        if arms:
            data["results"] = {n: r for n, r in data["results"].items()
                               if n in arms.split(",")}
        target = data.get("target") if target is None else target
        if data.get("target") != target:
            print(f"{path}: target {data.get('target')}, not {target}: its times to target "
                  "are to another threshold", file=sys.stderr)
        for name, res in data["results"].items():
            seen = sum(arm_kind(n) == arm_kind(name) for n, _ in runs)
            runs.append((f"{arm_kind(name)}-r{seen + 1}", res))
    table, _ = per_step(runs, target, until)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
