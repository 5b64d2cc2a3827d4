"""Each off-policy correction on the same recorded data: `astraflow retrain` of one run, once per
correction, and the held-out accuracy each reaches at the run's evaluated versions
(docs/trainer.md#corrections-as-other-frameworks-name-them).

    python -m bench.corrections RUN_DIR [--out DIR]

RUN_DIR is a finished run with evaluations (e.g. the quickstart from its warm model with
``--set trainer.max_steps=100 --set launch.eval_every=20``). Every arm trains a fresh trainer on
the run's batches in the run's order (off-policy learning on a fixed dataset, not new on-policy
runs): the first arm changes nothing and must measure exactly the run's own curve.

Prints markdown; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from astraflow.run.retrain import retrain
from bench.lib.runlog import read_jsonl

#: (name, trainer overrides)
ARMS: list[tuple[str, list[str]]] = [
    ("the run's own (token clip at 5)", []),
    ("no correction (weight uncapped)", ["trainer.loss.behaviour_cap=null"]),
    ("AReaL: token mask above 5", ["trainer.loss.behaviour_cap_mode=mask"]),
    ("IcePop: token mask outside [1/2, 2]", ["trainer.loss.behaviour_cap_mode=mask_both",
                                            "trainer.loss.behaviour_cap=2.0"]),
    ("sequence product, clip at 5", ["trainer.loss.behaviour_level=sequence"]),
    ("sequence geometric mean, mask outside [1/1.1, 1.1]",
     ["trainer.loss.behaviour_level=geometric", "trainer.loss.behaviour_cap_mode=mask_both",
      "trainer.loss.behaviour_cap=1.1"]),
    ("plain PPO against the engine's logprobs (decoupled: false)",
     ["trainer.loss.decoupled=false"]),
]


def trainer_means(path: Path) -> dict[str, float]:
    rows = read_jsonl(path)
    out = {}
    for k in ("behav_weight_mean", "capped_frac", "clip_frac"):
        xs = [r[k] for r in rows if isinstance(r.get(k), int | float)]
        if xs:
            out[k] = statistics.fmean(xs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.corrections",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, help="where the retrained directories go "
                                              "(default: a temporary directory)")
    args = ap.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="af-corrections-"))
    rows = []
    original: dict[int, float] = {}
    for i, (name, sets) in enumerate(ARMS):
        out = base / f"arm{i}"
        (result,) = list(retrain(args.run_dir, sets, out, ["default"]))
        original = result.original
        rows.append((name, sets, dict(result.evals), trainer_means(out / "trainer-default.jsonl")))
    steps = sorted(original)
    print(f"retrain of {args.run_dir} ({len(steps)} evaluated versions; the run itself: "
          + ", ".join(f"{s}: {original[s]:.3f}" for s in steps) + ")\n")
    print("| correction | " + " | ".join(f"v{s}" for s in steps)
          + " | behav weight mean | capped share |")
    print("|---|" + "---|" * len(steps) + "---|---|")
    for name, _sets, evals, means in rows:
        print(f"| {name} | " + " | ".join(f"{evals.get(s, float('nan')):.3f}" for s in steps)
              + f" | {means.get('behav_weight_mean', float('nan')):.3f}"
              + f" | {means.get('capped_frac', float('nan')):.4f} |")
    print(f"\ndirectories: {base}")


if __name__ == "__main__":
    main()
