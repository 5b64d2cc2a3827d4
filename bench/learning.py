"""Learning runs too long for CI: does RL raise the train reward, through the whole dataflow?

    python -m bench.learning                                   # every scenario, once
    python -m bench.learning gateway-agent --repeats 2         # one scenario, twice
    python -m bench.learning --warm runs/quickstart            # reuse a warm-up run
    astraflow run examples/quickstart.yaml --warmup-only --out runs/quickstart   # makes one

CI checks what these runs are made of on short runs (the trajectories exact, nothing lost or
trained twice, restarts, replay; tests/e2e/test_gateway_agent_e2e.py and test_lora_run_e2e.py)
and that the quickstart itself learns (test_quickstart_e2e.py). These scenarios take the
learning claims of the other paths, each from the quickstart's warm model (its SFT warm-up,
run once here unless ``--warm``; the tool agent makes its own), each one `astraflow run`:

* ``gateway-agent``: examples/gateway_agent.yaml (the SDK-only agent of
  examples/agents/adder.py through the rollout worker's own gateway), 150 steps of 16 groups
  x 8 episodes on the problems with both operands in 0..19. Learned: the mean train reward of
  the last 25 steps at least 0.05 above the first 25's.
* ``lora-sharded``: the quickstart with a LoRA trainer (r 8, lr 1e-3) sharded over two fsdp
  ranks, 150 steps of 64 x 8. Learned: the last 50 steps' mean train reward at least 0.02
  above the first 25's.
* ``tool-agent``: examples/agent_tools.yaml as it is (its own SFT warm-up into its band, then
  RL: episodes that call a multiplication tool), 80 steps, held-out evaluation (200 problems,
  the episode run with the tool) every 10. Learned: the mean of the two best evaluations after
  the first at least 0.10 above the first (the model has short collapses and recovers; the
  best, not the last: see tests/e2e/test_agent_tools.py).

The margins are the ones the CI tests used when these runs were CI tests (their reasoning:
five standard errors of the difference of the two means for the agent; the quickstart's own
margin for LoRA). Prints a markdown table (and writes ``<out>/learning.json``); exits 1 when a
run did not learn. One run is one sample: the warm model itself varies with the host's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.lib.arms import astraflow, cli_run_args
from bench.lib.runlog import read_jsonl, train_rewards

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Scenario:
    config: str                 # under examples/
    sets: tuple[str, ...]       # --set values (the warm model's are added)
    steps: int
    first: int                  # steps averaged at the start
    last: int                   # and at the end
    margin: float               # last mean - first mean at least this
    warm: str                   # "flag": --warm RUN (the quickstart); "path":
    #                             models.default.path=MODEL; "own": the example's own warm-up
    every: int | None = None    # held-out evaluations every this many steps (launch.eval_every):
    #                             learning measured on them, else on the train reward per step


SCENARIOS = {
    "gateway-agent": Scenario(
        "gateway_agent.yaml",
        ("data.batch_size=16", "trainer.optimizer.warmup_steps=5",
         "producer.arithmetic.max_value=19", "launch.evaluate=false"),
        steps=150, first=25, last=25, margin=0.05, warm="path"),
    "lora-sharded": Scenario(
        "quickstart.yaml",
        ("launch.eval_every=40", "trainer.parallel=fsdp", "launch.trainer_ranks=2",
         "trainer.lora={r: 8, alpha: 16}", "trainer.optimizer.lr=1.0e-3"),
        steps=150, first=25, last=50, margin=0.02, warm="flag"),
    "tool-agent": Scenario(
        "agent_tools.yaml", ("launch.eval_problems=200",),
        steps=80, first=1, last=2, margin=0.10, warm="own", every=10),
}


def held_out(run_dir: Path, every: int, steps: int, policy: str = "default") -> list[float]:
    """The evaluator's held-out accuracy on the grid 0, every, 2*every, ... steps: at each, the
    newest evaluation at or before it."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    lines = [r for r in rows if "eval_accuracy" in r and r.get("policy", policy) == policy]
    grid = []
    for k in range(0, steps + 1, every):
        at = [r for r in lines if r["step"] <= k]
        if at:
            grid.append(float(max(at, key=lambda r: r["step"])["eval_accuracy"]))
    return grid


def run_args(s: Scenario, warm_run: Path | None, out: Path) -> list[str]:
    """The `astraflow run` argument list of scenario ``s`` from the warm-up run ``warm_run``."""
    from astraflow.run.warmup import start_models

    sets = [*s.sets, f"trainer.max_steps={s.steps}", "launch.timeout_s=1800",
            *([f"launch.eval_every={s.every}"] if s.every else [])]
    warm: list[str] = []
    if s.warm == "flag":
        assert warm_run is not None
        warm = ["--warm", str(warm_run)]
    elif s.warm == "path":
        assert warm_run is not None
        model = start_models(warm_run)["default"]
        sets += [f"models.default.path={model}", "models.default.build=none",
                 "launch.warmup.steps=0"]
    # no --fresh: a run directory left by an earlier invocation is refused, not deleted
    return cli_run_args(EXAMPLES / s.config, out, sets, warm, fresh=False)


def quickstart_warmup(out: Path) -> Path:
    """`astraflow run examples/quickstart.yaml --warmup-only` into ``out``/warmup; its run
    directory. Not :func:`bench.lib.arms.make_warm`: that one runs a rewritten copy of any
    config (a one-second run where it has no warm-up), deletes an earlier directory
    (--fresh) and checks for config-rl.yaml; this one runs the example itself, refuses an
    earlier directory (an SFT warm-up this bench can reuse with --warm) and fails on the exit
    code."""
    run = out / "warmup"
    print(f"[warm-up] astraflow run examples/quickstart.yaml --warmup-only --out {run}",
          flush=True)
    code = astraflow(cli_run_args(EXAMPLES / "quickstart.yaml", run, flags=["--warmup-only"],
                                  fresh=False), out / "warmup.log", cwd=None)
    if code != 0:
        raise SystemExit(f"the warm-up failed (exit {code}); see {out / 'warmup.log'}")
    return run


@dataclass
class Result:
    scenario: str
    repeat: int
    exit_code: int
    steps: int
    first: float
    last: float
    gain: float
    margin: float
    learned: bool
    seconds: float


def measured(s: Scenario, run_dir: Path) -> tuple[list[float], int]:
    """The curve learning is judged on (held-out evaluations on the grid, or the train reward
    per step) and the number of RL steps the trainer logged."""
    rewards = (train_rewards(run_dir) if (run_dir / "trainer-default.jsonl").exists()
               else [])
    if s.every is None:
        return rewards, len(rewards)
    evals = (held_out(run_dir, s.every, s.steps) if (run_dir / "metrics.jsonl").exists()
             else [])
    return evals, len(rewards)


def run_one(name: str, repeat: int, warm_run: Path | None, out: Path) -> Result:
    s = SCENARIOS[name]
    run_dir = out / f"{name}-{repeat}"
    args = run_args(s, warm_run, run_dir)
    print(f"[{name} #{repeat}] astraflow {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    code = astraflow(args, out / f"{name}-{repeat}.log", cwd=None)
    seconds = time.monotonic() - t0
    curve, steps = measured(s, run_dir)
    if len(curve) < s.first + s.last:
        print(f"[{name} #{repeat}] exit {code}, {steps} steps: too few to compare "
              f"(see {out / f'{name}-{repeat}.log'})", flush=True)
        return Result(name, repeat, code, steps, float("nan"), float("nan"),
                      float("nan"), s.margin, False, seconds)
    if s.every:  # the first evaluation against the mean of the best after it
        first = curve[0]
        last = sum(sorted(curve[1:])[-s.last:]) / s.last
        what = f"held-out {curve}: {first:.3f} -> best {s.last} {last:.3f}"
    else:
        first = sum(curve[:s.first]) / s.first
        last = sum(curve[-s.last:]) / s.last
        what = f"reward {first:.3f} -> {last:.3f}"
    r = Result(name, repeat, code, steps, first, last, last - first, s.margin,
               code == 0 and steps == s.steps and last - first >= s.margin, seconds)
    print(f"[{name} #{repeat}] exit {code} in {seconds:.0f} s: {what} ({r.gain:+.3f}; "
          f"margin {s.margin})", flush=True)
    return r


def table(results: list[Result]) -> str:
    lines = ["| scenario | run | steps | first | last (held-out: best) | gain | margin | "
             "learned | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.scenario} | {r.repeat} | {r.steps} | {r.first:.3f} | "
                     f"{r.last:.3f} | {r.gain:+.3f} | {r.margin} | "
                     f"{'yes' if r.learned else 'no'} | {r.seconds:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS), metavar="SCENARIO",
                    help=f"of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--warm", type=Path, help="a quickstart run directory whose warm-up ended "
                    "(default: run the warm-up here first)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-learning")
    args = ap.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {unknown}; known: {', '.join(SCENARIOS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    needs_warm = any(SCENARIOS[n].warm != "own" for n in args.scenarios)
    warm = args.warm or (quickstart_warmup(args.out) if needs_warm else None)
    results = [run_one(n, i, warm, args.out)
               for i in range(args.repeats) for n in args.scenarios]
    (args.out / "learning.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(table(results))
    return 0 if all(r.learned for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
