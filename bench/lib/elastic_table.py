"""Scenarios and the comparison table of :mod:`bench.lib.elastic_model`
(``bench/elastic_sim.py``, ``bench/elastic_fit.py``).

The ``reference`` scenario has the shape of the AstraFlow paper's elasticity experiment: a
trainer on 4 GPUs, a rollout pool between 6 and 11 workers, a report every 10 trainer steps.
Its demand grows over the run, explicitly: responses grow ``length_growth``-fold, a trainer
step's time grows with the length and a group's generation time with ``length **
rollout_exponent`` (longer contexts decode slower), so the pool that keeps the trainer fed
grows from about 5.5 to about 11 workers. The parameters were calibrated (docs/elastic-sim.md)
so that fixed 6 and fixed 11 land near the paper's wait ratios and hours; every number in a
table comes out of the simulation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from astraflow.consumers.scaler.config import PoolConfig, ScaleConfig
from bench.lib.elastic_model import (
    Auto,
    Fixed,
    Lag,
    Oracle,
    Policy,
    SimParams,
    simulate,
)

#: the paper's table (fixed 6, fixed 11, auto 6-11): trainer wait, hours, rollout and total
#: GPU-hours; printed beside ours, never used by the simulation
REFERENCE: dict[str, tuple[float, float, float, float]] = {
    "fixed 6": (0.269, 35.8, 214.8, 358.0),
    "fixed 11": (0.021, 23.9, 263.4, 359.2),
    "auto (reference rule)": (0.030, 24.4, 214.5, 312.0),
}


def growth(length_growth: float, exponent: float, points: int = 11, curve: float = 1.0
           ) -> tuple[tuple[float, float], ...]:
    """A schedule ``(length at progress p) ** exponent`` for a length growing from 1 to
    ``length_growth`` over the run as ``1 + (length_growth - 1) · p ** curve`` (``curve`` 1:
    linearly; above 1 slowly at first)."""
    return tuple((i / (points - 1),
                  (1 + (length_growth - 1) * (i / (points - 1)) ** curve) ** exponent)
                 for i in range(points))


def reference_params(*, length_growth: float = 4.0, rollout_exponent: float = 1.65,
                     steps: int = 300, **overrides: object) -> SimParams:
    """The reference-shaped run (its calibration: docs/elastic-sim.md); ``overrides`` are
    :class:`SimParams` fields (``steps`` shortens it, keeping the shape)."""
    base = SimParams(steps=steps, batch_groups=32, max_staleness=2, train_s=112.8,
                     train_cv=0.05, group_s=67.0, group_sigma=0.5, slots=4,
                     start_delay_s=300.0, trainer_gpus=4, report_every_steps=10,
                     train_growth=growth(length_growth, 1.0),
                     rollout_growth=growth(length_growth, rollout_exponent))
    return replace(base, **overrides)  # type: ignore[arg-type]


def demand_params(*, need_start: float, need_end: float, length_growth: float = 4.0,
                  curve: float = 1.0, group_sigma: float = 0.5, slots: int = 4,
                  trainer_hours: float = 23.45, steps: int = 300,
                  **overrides: object) -> SimParams:
    """The reference-shaped run given by its demand instead of its step and group times: the
    pool that keeps the trainer fed goes from ``need_start`` to ``need_end`` workers as the
    length grows ``length_growth``-fold (shape ``curve``, see :func:`growth`), and the
    trainer computes ``trainer_hours`` in all. ``train_s``, ``group_s`` and the rollout
    exponent follow (``bench/elastic_fit.py`` fits these to the paper's three rows)."""
    if need_start <= 0 or need_end <= 0 or length_growth <= 1:
        raise ValueError("need_start and need_end must be > 0 and length_growth > 1")
    mean_length = 1 + (length_growth - 1) / (curve + 1)  # over the run: the trainer's compute
    train_s = trainer_hours * 3600 / (steps * mean_length)
    exponent = 1 + math.log(need_end / need_start) / math.log(length_growth)
    base = reference_params(steps=steps)
    return replace(base, train_s=train_s, group_sigma=group_sigma, slots=slots,
                   group_s=need_start * slots * train_s / base.batch_groups,
                   train_growth=growth(length_growth, 1.0, 21, curve),
                   rollout_growth=growth(length_growth, exponent, 21, curve),
                   **overrides)  # type: ignore[arg-type]


SCENARIOS = {"reference": reference_params}


def scale(lo: int, hi: int, **fields: object) -> ScaleConfig:
    """A ``scale`` section with one pool ``rollout`` of bounds ``lo``..``hi``."""
    return ScaleConfig(pools={"rollout": PoolConfig(min_workers=lo, max_workers=hi)},
                       **fields)  # type: ignore[arg-type]


def reference_arms(lo: int = 6, hi: int = 11) -> list[tuple[str, Policy]]:
    """The table's rows: fixed pools at both bounds, the rule as the paper states it (zones
    only: no useful lag, no hysteresis, no cooldown, no step limits), our defaults, our tuned
    settings with and without useful lag, and KEDA-style scalers on raw and useful lag."""
    paper = {"use_useful_lag": False, "confirm": 1, "cooldown_s": 0.0, "max_step_down": None}
    tuned = {"high_wait": 0.06, "low_wait": 0.03, "confirm": 1, "cooldown_s": 0.0,
             "max_step_up": 1, "report_every_steps": 20}
    return [
        ("fixed 6", Fixed(lo)),
        ("fixed 11", Fixed(hi)),
        ("auto (reference rule)", Auto(scale(lo, hi, **paper))),
        ("auto (our defaults)", Auto(scale(lo, hi))),
        ("auto tuned, wait only", Auto(scale(lo, hi, use_useful_lag=False, **tuned))),
        ("auto tuned, wait + useful lag", Auto(scale(lo, hi, use_useful_lag=True, **tuned))),
        ("KEDA on raw lag", Lag("tasks_lag", per_worker=7.0, min_workers=lo, max_workers=hi)),
        ("KEDA on useful lag", Lag("useful_lag", per_worker=7.0, min_workers=lo,
                                   max_workers=hi)),
        ("oracle (knows the demand; a bound)", Oracle(lo, hi)),
    ]


@dataclass(frozen=True)
class Row:
    """One arm, averaged over seeds. Hours are worker-hours (GPU-hours) but ``wall_h``."""

    label: str
    wait: float  # mean of the report windows' trainer wait ratios
    wait_time: float  # trainer wait / wall time
    wall_h: float
    rollout_h: float
    trainer_h: float
    total_h: float
    mean_pool: float
    actions: float
    seeds: int
    vs_best_fixed: float = 0.0  # total_h / the best fixed pool's total_h - 1
    work_h: float = 0.0  # the work itself (Result.work_h): rollout busy + trainer compute


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def simulate_table(scenario: str | SimParams = "reference", seeds: Sequence[int] = (0, 1, 2),
                   arms: Sequence[tuple[str, Policy]] | None = None) -> list[Row]:
    """Every arm of ``arms`` (default :func:`reference_arms`) on ``scenario`` (a name of
    :data:`SCENARIOS` or a :class:`SimParams`) for each seed; one :class:`Row` per arm, the
    seeds' mean. ``vs_best_fixed`` compares totals with the cheapest :class:`Fixed` arm."""
    if isinstance(scenario, str):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")
        params = SCENARIOS[scenario]()
    else:
        params = scenario
    if not seeds:
        raise ValueError("seeds: give at least one seed")
    arms = list(arms) if arms is not None else reference_arms()
    rows = []
    for label, policy in arms:
        rs = [simulate(params, policy, seed) for seed in seeds]
        rows.append(Row(
            label=label, wait=_mean(r.wait for r in rs), wait_time=_mean(r.wait_time for r in rs),
            wall_h=_mean(r.wall_h for r in rs), rollout_h=_mean(r.rollout_h for r in rs),
            trainer_h=_mean(r.trainer_h for r in rs), total_h=_mean(r.total_h for r in rs),
            mean_pool=_mean(r.mean_pool for r in rs), actions=_mean(r.actions for r in rs),
            seeds=len(rs), work_h=_mean(r.work_h for r in rs)))
    fixed = [r.total_h for r, (_, p) in zip(rows, arms, strict=True)
             if isinstance(p, Fixed)]
    best = min(fixed) if fixed else math.nan
    return [replace(r, vs_best_fixed=r.total_h / best - 1) for r in rows]


def format_table(rows: Sequence[Row], reference: dict[str, tuple[float, float, float, float]]
                 | None = None) -> str:
    """A markdown table of ``rows``; with ``reference``, the paper's numbers for rows of the
    same label in brackets."""
    head = ("| arm | trainer wait (reports) | wait (time) | hours | rollout GPU-h | "
            "total GPU-h | vs best fixed | mean pool | actions |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        ref = (reference or {}).get(r.label)

        def cell(value: float, i: int, fmt: str, ref: tuple[float, ...] | None = ref) -> str:
            return fmt.format(value) + (f" [{fmt.format(ref[i])}]" if ref else "")

        lines.append(
            f"| {r.label} | {cell(r.wait, 0, '{:.1%}')} | {r.wait_time:.1%} | "
            f"{cell(r.wall_h, 1, '{:.1f}')} | {cell(r.rollout_h, 2, '{:.1f}')} | "
            f"{cell(r.total_h, 3, '{:.1f}')} | {r.vs_best_fixed:+.1%} | "
            f"{r.mean_pool:.2f} | {r.actions:.1f} |")
    return "\n".join(lines)


def target_line(rows: Sequence[Row], saving: float = 0.13, max_wait: float = 0.05) -> str:
    """The elasticity target checked on ``rows``: the cheapest auto arm within ``max_wait``
    trainer wait (reports) against ``saving`` fewer total GPU-hours than the best fixed
    pool."""
    autos = [r for r in rows if r.label.startswith("auto") and r.wait <= max_wait]
    head = (f"target (>= {saving:.0%} fewer total GPU-h than the best fixed pool at "
            f"<= {max_wait:.0%} wait): ")
    if not autos:
        return head + f"NOT met; no auto arm within {max_wait:.0%} wait"
    best = min(autos, key=lambda r: r.total_h)
    met = "met" if best.vs_best_fixed <= -saving else "NOT met"
    return (head + f"{met}; best auto: {best.label}, {best.vs_best_fixed:+.1%} at "
            f"{best.wait:.1%}")


def fixed_sweep(lo: int, hi: int) -> list[tuple[str, Policy]]:
    """Every fixed pool from ``lo`` to ``hi`` workers: the baselines between the paper's two."""
    if not 1 <= lo <= hi:
        raise ValueError(f"fixed_sweep: need 1 <= lo <= hi, got lo={lo} hi={hi}")
    return [(f"fixed {n}", Fixed(n)) for n in range(lo, hi + 1)]


def baseline_lines(fixed: Sequence[Row], autos: Sequence[Row], saving: float = 0.13,
                   max_wait: float = 0.05) -> list[str]:
    """The cheapest auto arm of ``autos`` within ``max_wait`` trainer wait (reports) against
    the cheapest pool of ``fixed`` (any wait) and the cheapest one within ``max_wait``; what
    ``saving`` against each asks for; and the work itself (the least ``work_h`` of any row:
    rollout busy plus trainer compute), which no pool, however scaled, can spend less than."""
    if not fixed:
        raise ValueError("baseline_lines: give at least one fixed row")
    within = [r for r in autos if r.wait <= max_wait]
    work = min(r.work_h for r in (*fixed, *autos))
    cheapest = min(fixed, key=lambda r: r.total_h)
    fed = [r for r in fixed if r.wait <= max_wait]
    bases = [("the cheapest fixed pool", cheapest)]
    if fed:
        bases.append((f"the cheapest fixed pool within {max_wait:.0%} wait",
                      min(fed, key=lambda r: r.total_h)))
    best = min(within, key=lambda r: r.total_h) if within else None
    lines = []
    for name, base in bases:
        asks = (1 - saving) * base.total_h
        line = (f"{name}: {base.label}, {base.total_h:.1f} GPU-h at {base.wait:.1%} wait; "
                f"-{saving:.0%} asks for {asks:.1f} GPU-h"
                + (" (less than the work itself)" if asks < work else ""))
        if best is not None:
            line += (f"; best auto ({best.label}, {best.wait:.1%} wait): "
                     f"{best.total_h / base.total_h - 1:+.1%}")
        lines.append(line)
    lines.append(f"the work itself (rollout busy + trainer compute, the least of any arm): "
                 f"{work:.1f} GPU-h")
    return lines
