"""A team of adapters against its solver trained alone, at equal wall clock
(docs/results/several-models.md): pairs of `astraflow run` of the team config and of the
solver-alone config, each for the same seconds from the same start (the base model, fresh LoRA adapters), then the
final weights of each measured on the same held-out problems.

    python -m bench.team_vs_alone                          # 2 pairs, 600 s of each run
    python -m bench.team_vs_alone --pairs 3 --seconds 900 --out runs/team-vs-alone
    python -m bench.team_vs_alone --first-pair 2 --pairs 1  # one more pair after those 2

The runs evaluate nothing while they train (``launch.evaluate=false``: the evaluators would
take the cores from training, unequally for one policy and two); afterwards `astraflow
evaluate` measures version 0 and the last version of every policy:

* the team: system accuracy (the workflow greedily: the solver answers, the verifier judges,
  a reject earns one retry: at most two solver answers a problem) and the solver's first
  answer;
* the solver alone: greedy accuracy, and the majority vote of ``--votes`` answers sampled at
  the rollout temperature (as many answers as the team may draw; a tie goes to the first).

A pair's margin is the team's system accuracy minus the better of the baseline's two. Runs
alternate their order from pair to pair (team first, then alone first). Results:
``<out>/team_vs_alone.json`` and a markdown table; one machine, one sample per run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.arms import astraflow, cli_run_args

ROOT = Path(__file__).resolve().parents[1]
TEAM = ROOT / "examples" / "smollm2_team.yaml"
ALONE = ROOT / "examples" / "smollm2_solver_alone.yaml"
NUM = r"([0-9.]+)"


def astraflow_checked(args: list[str], log: Path, timeout: float) -> str:
    """Run the CLI, its output to ``log`` (and returned); a failure is an error."""
    print(f"  $ astraflow {' '.join(args)}", flush=True)
    rc = astraflow(args, log, timeout=timeout)
    text = log.read_text()
    if rc != 0:
        raise RuntimeError(f"astraflow {args[0]} exited {rc}; see {log}:\n{text[-3000:]}")
    return text


def train(config: Path, out: Path, seconds: float, seed: int) -> dict[str, Any]:
    t0 = time.monotonic()
    astraflow_checked(cli_run_args(config, out, [f"launch.timeout_s={seconds}",
                                                 "launch.evaluate=false", f"seed={seed}"]),
                      out.parent / f"{out.name}.log", seconds + 600)
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["accounting"]
    steps = summary.get("trainer_steps_by_policy") or {"solver": summary.get("trainer_steps")}
    return {"wall_s": round(time.monotonic() - t0, 1), "steps": steps,
            "unaccounted": acc.get("unaccounted"), "trained_twice": acc.get("trained_twice")}


def evaluate(out: Path, what: list[str], log: str) -> str:
    """`astraflow evaluate` of the run's own config: version 0, then the run's last version
    (eval_every too large to stop earlier: the last version is evaluated once it is idle)."""
    return astraflow_checked(["evaluate", str(out / "config.yaml"), "--out", str(out), *what,
                              "--max-evals", "2", "--timeout", "1200",
                              "--set", "launch.eval_every=1000000"], out.parent / log, 1500)


def team_scores(out: Path) -> list[dict[str, Any]]:
    text = evaluate(out, ["--team"], f"{out.name}-eval.log")
    rows = re.findall(r"versions (\{[^}]*\}): system accuracy " + NUM + ", first answer " + NUM
                      + ", retry rate " + NUM, text)
    if len(rows) != 2:
        raise RuntimeError(f"expected two team evaluations in {text[-2000:]}")
    return [{"versions": v, "system": float(s), "first": float(f), "retry_rate": float(r)}
            for v, s, f, r in rows]


def alone_scores(out: Path, votes: int) -> list[dict[str, Any]]:
    text = evaluate(out, ["--policy", "solver", "--set", f"launch.eval_samples={votes}"],
                    f"{out.name}-eval.log")
    rows = re.findall(r"version (\d+): accuracy " + NUM + r", \d+ sampled: accuracy " + NUM
                      + ", pass@k " + NUM + ", majority " + NUM, text)
    if len(rows) != 2:
        raise RuntimeError(f"expected two evaluations in {text[-2000:]}")
    return [{"version": int(v), "greedy": float(g), "sampled": float(s),
             "pass_at_k": float(p), "majority": float(m)} for v, g, s, p, m in rows]


def table(pairs: list[dict[str, Any]], votes: int) -> str:
    lines = ["| pair | team steps (solver/verifier) | team system: start → end | team solver "
             "first answer | alone steps | alone greedy: start → end | alone maj@"
             f"{votes} end | margin |", "|---|---|---|---|---|---|---|---:|"]
    for p in pairs:
        i, t, a = p["pair"], p["team"], p["alone"]
        steps = t["run"]["steps"] or {}
        lines.append(
            f"| {i} | {steps.get('solver')}/{steps.get('verifier')} | "
            f"{t['eval'][0]['system']:.3f} → {t['eval'][1]['system']:.3f} | "
            f"{t['eval'][1]['first']:.3f} | {(a['run']['steps'] or {}).get('solver')} | "
            f"{a['eval'][0]['greedy']:.3f} → {a['eval'][1]['greedy']:.3f} | "
            f"{a['eval'][1]['majority']:.3f} | {p['margin']:+.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.team_vs_alone",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--team", type=Path, default=TEAM)
    ap.add_argument("--alone", type=Path, default=ALONE)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--first-pair", type=int, default=0,
                    help="number of the first pair: pair i runs with seed i, team first when "
                         "i is even (more pairs after an earlier invocation: --first-pair 2)")
    ap.add_argument("--seconds", type=float, default=600.0, help="launch.timeout_s of a run")
    ap.add_argument("--votes", type=int, default=2,
                    help="answers the baseline draws for its majority vote (the team's most)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "team-vs-alone")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.seconds <= 0 or args.votes < 1 or args.first_pair < 0:
        ap.error("--pairs >= 1, --first-pair >= 0, --seconds > 0 and --votes >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    pairs: list[dict[str, Any]] = []
    for i in range(args.first_pair, args.first_pair + args.pairs):
        pair: dict[str, Any] = {"pair": i}
        order = ("team", "alone") if i % 2 == 0 else ("alone", "team")
        for arm in order:
            out = args.out / f"{arm}-{i}"
            print(f"pair {i}: {arm} ({args.seconds:.0f} s)", flush=True)
            run = train(args.team if arm == "team" else args.alone, out, args.seconds, seed=i)
            scores = team_scores(out) if arm == "team" else alone_scores(out, args.votes)
            pair[arm] = {"run": run, "eval": scores}
            print(f"  {arm}: {json.dumps(pair[arm])}", flush=True)
        end = pair["alone"]["eval"][1]
        pair["margin"] = pair["team"]["eval"][1]["system"] - max(end["greedy"], end["majority"])
        pairs.append(pair)
        (args.out / "team_vs_alone.json").write_text(json.dumps(
            {"seconds": args.seconds, "votes": args.votes, "pairs": pairs}, indent=2))
    margins = [p["margin"] for p in pairs]
    print(table(pairs, args.votes))
    spread = statistics.stdev(margins) if len(margins) > 1 else 0.0
    print(f"\nmargin (team system - better of alone greedy / maj@{args.votes}), mean ± sd over "
          f"{len(margins)} pairs: {statistics.mean(margins):+.3f} ± {spread:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
