"""The elasticity simulator on the reference-shaped run (docs/elastic-sim.md): fixed pools of 6
and 11 rollout workers, the scaler's rule as the AstraFlow paper states it, our defaults, our
tuned settings with and without useful lag, KEDA-style scalers on raw and on useful lag, and an
oracle that knows the demand curve (a bound on what any scaler could do), each averaged over
seeds; the paper's numbers in brackets beside ours.

    python -m bench.elastic_sim                       # 10 seeds, the table
    python -m bench.elastic_sim --seeds 10 --plot docs/img/elastic-sim.png

Every number is simulated; the paper's are only printed. The elasticity target (at least 13%
fewer total GPU-hours than the best fixed pool at no more than 5% trainer wait) is checked
against the best auto arm and printed as met or not.

A second table runs every fixed pool from 6 to 12 workers, the baselines between the paper's
two, and compares the best auto arm with the cheapest of them and with the work itself.

A third table starts the auto arms at the pool's maximum (11 workers, over-provisioned early
in the run), with the reports' ``utilization`` and without it (-1: the rule's idle zone on
``produced`` alone, as before reports carried it): behind the staleness gate an
over-provisioned pool's spare capacity shows only as idle slots.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from bench.lib.elastic_model import Auto, Fixed, Policy, SimParams, simulate
from bench.lib.elastic_table import (
    REFERENCE,
    baseline_lines,
    fixed_sweep,
    format_table,
    reference_arms,
    reference_params,
    simulate_table,
    target_line,
)
from bench.lib.plots import pyplot, save_figure


def describe(p: SimParams) -> str:
    return (f"steps={p.steps} B={p.batch_groups} k={p.max_staleness} (horizon {p.horizon}) "
            f"train_s={p.train_s} cv={p.train_cv} group_s={p.group_s} sigma={p.group_sigma} "
            f"slots={p.slots} start_delay_s={p.start_delay_s} trainer_gpus={p.trainer_gpus}; "
            f"need {p.need(0):.2f} -> {p.need(0.5):.2f} -> {p.need(1):.2f} workers "
            f"(start, middle, end); trainer step x{p.train_growth[-1][1]:.1f}, "
            f"group x{p.rollout_growth[-1][1]:.2f} over the run")


def plot(params: SimParams, path: Path, seed: int) -> None:
    plt = pyplot()
    arms = [(label, pol) for label, pol in reference_arms() if isinstance(pol, Auto)]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for (label, pol), colour in zip(arms, ["C0", "C1", "C2", "C3"], strict=False):
        r = simulate(params, pol, seed)
        ts, sizes = zip(*[(t, asked) for t, asked, _ in r.series], strict=True)
        ax.step(ts, sizes, where="post", color=colour, label=label)
        bx.plot([rep.window_end / 3600 for rep in r.reports],
                [rep.wait_ratio for rep in r.reports], color=colour, marker=".", label=label)
        if label.startswith("auto tuned, wait + useful"):
            ax.plot([rep.window_end / 3600 for rep in r.reports],
                     [params.need(rep.trainer_step / params.steps) for rep in r.reports],
                     "k--", label="need (workers that keep up)")
    ax.set_ylabel("rollout workers asked for")
    ax.legend(fontsize=7)
    bx.set_ylabel("trainer wait (report window)")
    bx.set_xlabel("hours")
    bx.axhline(0.05, color="grey", lw=0.5)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.elastic_sim",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--steps", type=int, default=300, help="trainer steps (default 300)")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG of the auto runs")
    args = ap.parse_args()
    params = reference_params(steps=args.steps)
    t0 = time.perf_counter()
    rows = simulate_table(params, seeds=range(args.seeds))
    print(f"reference-shaped run: {describe(params)}")
    print(f"{args.seeds} seeds, {time.perf_counter() - t0:.1f}s; [paper] in brackets\n")
    print(format_table(rows, REFERENCE))
    print(f"\n{target_line(rows)}")
    fixed: list[tuple[str, Policy]] = [(label, pol) for label, pol in reference_arms()
                                        if isinstance(pol, Fixed)]
    sizes = [pol.workers for _, pol in fixed if isinstance(pol, Fixed)]
    lo, hi = min(sizes), max(sizes)
    sweep = simulate_table(params, seeds=range(args.seeds), arms=fixed_sweep(lo, hi + 1))
    print(f"\nevery fixed pool from {lo} to {hi + 1} (the paper ran only {lo} and {hi}):\n")
    print(format_table(sweep))
    print("")
    print("\n".join(baseline_lines(sweep, [r for r in rows if r.label.startswith("auto")])))
    from_hi: list[tuple[str, Policy]] = [(f"{label}, from {hi}", replace(pol, initial=hi))
                                         for label, pol in reference_arms()
                                         if isinstance(pol, Auto)]
    blind = [(f"{label}, no utilization", pol) for label, pol in from_hi]
    rows = simulate_table(params, seeds=range(args.seeds), arms=fixed + from_hi)
    rows_blind = simulate_table(replace(params, report_utilization=False),
                                seeds=range(args.seeds), arms=fixed + blind)
    print(f"\nthe auto arms started at {hi} workers, with the reports' utilization and "
          f"without it (-1):\n")
    print(format_table(rows + rows_blind[len(fixed):]))
    if args.plot:
        plot(params, args.plot, seed=0)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
