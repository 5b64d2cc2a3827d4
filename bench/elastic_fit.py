"""Fit the elasticity simulator to all three rows of the AstraFlow paper's table (fixed 6,
fixed 11 and its automatic run), then print the table of every arm on the fitted demand.

The ``reference`` scenario of bench/elastic_sim.py was fitted to the two fixed rows only, and
its auto rows are predictions. This asks the other question: is there a demand curve that
reproduces the paper's auto row too, and what do the scalers save on it? The free
parameters (``elastic_table.demand_params``): the need (workers that keep the trainer fed) at
the start and at the end, the curve of the length's growth and its factor, the long tail
(lognormal sigma) and the trainer's compute in hours; ``--slots`` (groups a worker runs at
once) is fixed per fit. The loss is each row's distance to the paper's trainer wait (per
point), hours (per 0.5 h) and rollout GPU-hours (per 3 GPU-h), on seeds 100-102; the table is
on seeds 0..N-1 (other seeds than the fit's).

    python -m bench.elastic_fit                      # slots 1 and 4, ~3 min each on 2 cores
    python -m bench.elastic_fit --slots 4 --iters 60

Every number is simulated; the paper's are printed in brackets.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from bench.lib.elastic_model import SimParams
from bench.lib.elastic_table import (
    REFERENCE,
    demand_params,
    format_table,
    reference_arms,
    simulate_table,
    target_line,
)

# (name, lower bound, upper bound, start) of each fitted parameter
PARAMS = [("need_start", 2.0, 6.5, 4.75), ("need_end", 10.0, 13.0, 11.7),
          ("curve", 0.3, 3.0, 1.0), ("length_growth", 1.5, 10.0, 4.0),
          ("group_sigma", 0.2, 1.2, 0.5), ("trainer_hours", 23.0, 23.9, 23.45)]
ROWS = ["fixed 6", "fixed 11", "auto (reference rule)"]
FIT_SEEDS = (100, 101, 102)


def loss(values: Sequence[float], slots: int) -> float:
    arms = [(label, pol) for label, pol in reference_arms() if label in ROWS]
    rows = simulate_table(params(values, slots), seeds=FIT_SEEDS, arms=arms)
    total = 0.0
    for r in rows:
        wait, hours, rollout, _ = REFERENCE[r.label]
        total += (((r.wait - wait) / 0.01) ** 2 + ((r.wall_h - hours) / 0.5) ** 2
                  + ((r.rollout_h - rollout) / 3.0) ** 2)
    return total


def params(values: Sequence[float], slots: int) -> SimParams:
    return demand_params(slots=slots, **dict(zip([p[0] for p in PARAMS], clip(values),
                                                 strict=True)))


def clip(values: Sequence[float]) -> list[float]:
    return [min(max(v, lo), hi) for v, (_, lo, hi, _) in zip(values, PARAMS, strict=True)]


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], iters: int
                ) -> tuple[list[float], float]:
    """The textbook simplex search (reflect, expand, contract, shrink) within PARAMS' bounds;
    the simulator's seeded streams make ``f`` deterministic."""
    n = len(x0)
    pts = [clip(x0)] + [clip([v + (0.15 * (PARAMS[i][2] - PARAMS[i][1]) if i == j else 0.0)
                              for i, v in enumerate(x0)]) for j in range(n)]
    fs = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=fs.__getitem__)
        pts, fs = [pts[i] for i in order], [fs[i] for i in order]
        centre = [sum(p[i] for p in pts[:-1]) / n for i in range(n)]
        worst = pts[-1]

        def towards(t: float, centre: list[float] = centre, worst: list[float] = worst
                    ) -> list[float]:
            return clip([c + t * (w - c) for c, w in zip(centre, worst, strict=True)])

        xr = towards(-1.0)
        fr = f(xr)
        if fr < fs[0]:
            xe = towards(-2.0)
            fe = f(xe)
            pts[-1], fs[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < fs[-2]:
            pts[-1], fs[-1] = xr, fr
        else:
            xc = towards(0.5)
            fc = f(xc)
            if fc < fs[-1]:
                pts[-1], fs[-1] = xc, fc
            else:
                pts = [pts[0]] + [clip([b + 0.5 * (v - b) for b, v in zip(pts[0], p,
                                                                          strict=True)])
                                  for p in pts[1:]]
                fs = [fs[0]] + [f(p) for p in pts[1:]]
    best = min(range(n + 1), key=fs.__getitem__)
    return pts[best], fs[best]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.elastic_fit",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4],
                    help="groups a worker runs at once, one fit each (default 1 4)")
    ap.add_argument("--iters", type=int, default=120, help="simplex iterations per fit")
    ap.add_argument("--seeds", type=int, default=10, help="the table: seeds 0..N-1")
    args = ap.parse_args()
    for slots in args.slots:
        if slots < 1:
            ap.error("--slots: at least 1")
        t0 = time.perf_counter()
        x, f = nelder_mead(lambda v, s=slots: loss(v, s), [p[3] for p in PARAMS], args.iters)
        p = params(x, slots)
        fitted = ", ".join(f"{name} {v:.3f}" for (name, *_), v in zip(PARAMS, clip(x),
                                                                       strict=True))
        print(f"\n## slots {slots}: loss {f:.2f} ({time.perf_counter() - t0:.0f} s)\n")
        print(f"fitted: {fitted}; need {p.need(0):.2f} -> {p.need(0.5):.2f} -> "
              f"{p.need(1):.2f} workers (start, middle, end)\n")
        rows = simulate_table(p, seeds=range(args.seeds))
        print(format_table(rows, REFERENCE))
        print(f"\n{target_line(rows)}")


if __name__ == "__main__":
    main()
