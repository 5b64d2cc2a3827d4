"""The elasticity model (bench/lib/elastic_model.py): accounting, the rule in the
loop, start delay, the reports' utilization, determinism, and the reference-shaped
calibration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.lib.elastic_model import (
    FLAT,
    Auto,
    Fixed,
    Lag,
    Oracle,
    SimParams,
    at,
    simulate,
)
from bench.lib.elastic_table import (
    REFERENCE,
    Row,
    baseline_lines,
    demand_params,
    fixed_sweep,
    format_table,
    growth,
    reference_arms,
    reference_params,
    scale,
    simulate_table,
    target_line,
)

# a short, flat run that needs B * group_s / (slots * train_s) = 8 * 10 / (2 * 20) = 2 workers
SMALL = SimParams(steps=40, batch_groups=8, max_staleness=2, train_s=20.0, group_s=10.0,
                  slots=2, start_delay_s=30.0, report_every_steps=5)


def test_schedule_is_piecewise_linear_and_flat_outside() -> None:
    s = ((0.0, 1.0), (0.5, 3.0), (1.0, 2.0))
    assert at(s, -1) == 1.0 and at(s, 0.25) == 2.0 and at(s, 0.75) == 2.5 and at(s, 2) == 2.0
    assert at(FLAT, 0.3) == 1.0


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_fixed_pool_accounting_is_exact(workers: int) -> None:
    r = simulate(SMALL, Fixed(workers), seed=1)
    assert r.consumed == SMALL.steps * SMALL.batch_groups
    assert r.consumed_unique == r.consumed  # no group trained twice
    assert r.produced == r.consumed + r.left_ready  # every group produced is trained or left
    assert r.released == r.produced + r.left_in_flight  # every group released is accounted
    assert r.released <= (SMALL.steps + SMALL.max_staleness + 1) * SMALL.batch_groups
    assert r.rollout_h == pytest.approx(workers * r.wall_h)
    assert r.trainer_h == pytest.approx(SMALL.trainer_gpus * r.wall_h)
    assert r.busy_h <= r.rollout_h
    assert r.actions == 0 and len(r.reports) == SMALL.steps // SMALL.report_every_steps


def test_groups_finishing_at_the_same_instant_wake_the_trainer_once() -> None:
    """group_sigma 0: every group takes exactly group_s, so a worker's slots finish together
    and each wake-up of the waiting trainer comes with another group at the same time (the
    event clock fires them one by one, first scheduled first)."""
    p = replace(SMALL, group_sigma=0.0)
    r = simulate(p, Fixed(3), seed=0)
    assert r.consumed == p.steps * p.batch_groups and r.consumed_unique == r.consumed
    assert r.produced == r.consumed + r.left_ready
    assert 0.0 < r.wait_time < 1.0  # it waited, and each wait ended once
    assert r == simulate(p, Fixed(3), seed=0)


def test_reports_are_real_load_reports_with_useful_lag() -> None:
    r = simulate(SMALL, Fixed(2), seed=0)
    for rep in r.reports:
        assert rep.horizon == SMALL.horizon
        assert rep.useful_lag == min(rep.tasks_lag, max(0, rep.horizon - rep.ready))
        assert 0.0 <= rep.wait_ratio <= 1.0 and rep.current_workers == 2
        assert 0.0 <= rep.utilization <= 1.0
        assert rep.consumed == SMALL.report_every_steps * SMALL.batch_groups
    assert sum(rep.produced for rep in r.reports) == r.produced


def test_a_starved_pool_waits_more_than_a_large_one() -> None:
    assert SMALL.need(0.5) == pytest.approx(2.0)
    small, large = simulate(SMALL, Fixed(1), seed=3), simulate(SMALL, Fixed(4), seed=3)
    assert small.wait > 0.3 > 0.1 > large.wait
    assert small.wall_h > large.wall_h


def test_utilization_is_the_busy_share_lower_for_an_over_provisioned_pool() -> None:
    starved, over = simulate(SMALL, Fixed(1), seed=3), simulate(SMALL, Fixed(8), seed=3)
    for r in (starved, over):
        assert all(0.0 <= rep.utilization <= 1.0 for rep in r.reports)
        # time-weighted: the windows' utilization, weighted by their length, is the pool's
        # busy share of its worker-hours (a fixed pool: every worker runs every window)
        spans = [rep.window_end - rep.window_start for rep in r.reports]
        weighted = sum(rep.utilization * s for rep, s in zip(r.reports, spans, strict=True))
        assert weighted / sum(spans) == pytest.approx(r.busy_h / r.rollout_h, abs=0.02)
    # the gate releases only what the trainer consumes: 8 workers for a need of 2 idle ~3/4
    assert max(rep.utilization for rep in over.reports) < 0.4
    assert min(rep.utilization for rep in starved.reports) > 0.95
    blind = simulate(replace(SMALL, report_utilization=False), Fixed(8), seed=3)
    assert {rep.utilization for rep in blind.reports} == {-1.0}


def test_a_starting_worker_is_not_counted_idle() -> None:
    # one starved worker; the rule asks for a second at the first report, useful 120 s later:
    # the next window holds its start-up, and the pool's utilization stays that of the
    # workers running (all busy), not diluted by the one starting
    pol = Auto(scale(1, 2, confirm=1, cooldown_s=0.0, report_every_steps=5))
    r = simulate(replace(SMALL, start_delay_s=120.0), pol, seed=0)
    first, second = r.reports[0], r.reports[1]
    t_up = next(t for t, _, useful in r.series if useful > 1) * 3600
    assert second.window_start < t_up < second.window_end and first.current_workers == 1
    assert second.utilization == pytest.approx(1.0)


def test_utilization_lets_the_rule_scale_an_over_provisioned_pool_down() -> None:
    # 8 workers for a need of 2: behind the gate produced == consumed, so without utilization
    # the idle zone's consumed/produced x headroom never asks for fewer; with it, it does
    pol = Auto(scale(1, 8, confirm=1, cooldown_s=0.0, report_every_steps=5), initial=8)
    seen = simulate(SMALL, pol, seed=0)
    blind = simulate(replace(SMALL, report_utilization=False), pol, seed=0)
    assert [asked for _, asked, _ in blind.series] == [8, 8] and blind.actions == 0
    assert min(asked for _, asked, _ in seen.series) <= 3
    assert seen.rollout_h < 0.8 * blind.rollout_h and seen.wait < 0.05


def test_auto_scales_up_when_starved_and_stays_within_bounds() -> None:
    pol = Auto(scale(1, 3, confirm=1, cooldown_s=0.0, report_every_steps=5))
    r = simulate(SMALL, pol, seed=2)
    sizes = [asked for _, asked, _ in r.series]
    assert sizes[0] == 1 and max(sizes) > 1 and r.actions > 0
    assert all(1 <= n <= 3 for n in sizes)
    assert r.wait < simulate(SMALL, Fixed(1), seed=2).wait
    assert r.consumed_unique == r.consumed == SMALL.steps * SMALL.batch_groups


def test_lag_scaler_and_oracle_stay_within_bounds() -> None:
    for pol in (Lag("tasks_lag", per_worker=2.0, min_workers=1, max_workers=5),
                Lag("useful_lag", per_worker=2.0, min_workers=1, max_workers=5),
                Oracle(1, 5)):
        r = simulate(SMALL, pol, seed=0)
        assert all(1 <= asked <= 5 for _, asked, _ in r.series)
        assert r.consumed == SMALL.steps * SMALL.batch_groups


def test_start_delay_delays_capacity() -> None:
    pol = Auto(scale(1, 8, confirm=1, cooldown_s=0.0, report_every_steps=5))
    fast = simulate(replace(SMALL, start_delay_s=0.0), pol, seed=4)
    slow = simulate(replace(SMALL, start_delay_s=120.0), pol, seed=4)
    # a worker asked for becomes useful start_delay_s later
    t_ask = next(t for t, asked, _ in slow.series if asked > 1)
    t_up = next(t for t, _, useful in slow.series if useful > 1)
    assert t_up - t_ask == pytest.approx(120.0 / 3600)
    assert slow.wall_h > fast.wall_h


def test_scale_down_drains_without_losing_work() -> None:
    # a trainer-bound run from a large pool: the rule scales down; nothing is lost
    params = replace(SMALL, group_s=2.0, group_sigma=1.0)
    pol = Auto(scale(1, 8, confirm=1, cooldown_s=0.0, report_every_steps=5), initial=8)
    r = simulate(params, pol, seed=5)
    assert min(asked for _, asked, _ in r.series) < 8
    assert r.consumed_unique == r.consumed and r.produced == r.consumed + r.left_ready
    assert r.released == r.produced + r.left_in_flight


def test_same_seed_same_run_other_seed_other_run() -> None:
    pol = Auto(scale(1, 3, confirm=1, cooldown_s=0.0, report_every_steps=5))
    a, b, c = (simulate(SMALL, pol, seed=s) for s in (7, 7, 8))
    assert (a.wall_h, a.rollout_h, a.wait, a.series) == (b.wall_h, b.rollout_h, b.wait, b.series)
    assert a.wall_h != c.wall_h


def test_reference_calibration_lands_near_the_paper() -> None:
    # a third of the run (100 steps, the same shape): the paper's 300-step numbers scale by
    # the run's length for hours; wait ratios compare as they are
    params = reference_params(steps=100)
    rows = simulate_table(params, seeds=(0, 1), arms=reference_arms()[:3])
    by = {r.label: r for r in rows}
    for label in ("fixed 6", "fixed 11", "auto (reference rule)"):
        wait, hours, _, _ = REFERENCE[label]
        assert by[label].wait == pytest.approx(wait, abs=0.05), label
    assert by["fixed 6"].wall_h > 1.3 * by["fixed 11"].wall_h
    assert by["auto (reference rule)"].total_h < min(by["fixed 6"].total_h,
                                                      by["fixed 11"].total_h)
    assert 6 < by["auto (reference rule)"].mean_pool < 11
    text = format_table(rows, REFERENCE)
    assert "| fixed 6 |" in text and "[26.9%]" in text


def test_simulate_table_rejects_an_unknown_scenario() -> None:
    with pytest.raises(ValueError, match="valid: reference"):
        simulate_table("nope")


def test_growth_curve_bends_the_length_and_keeps_its_ends() -> None:
    linear, late = growth(4.0, 1.0, 5), growth(4.0, 1.0, 5, curve=2.0)
    assert linear == ((0.0, 1.0), (0.25, 1.75), (0.5, 2.5), (0.75, 3.25), (1.0, 4.0))
    assert late[0] == (0.0, 1.0) and late[-1] == (1.0, 4.0)
    assert late[2] == (0.5, 1.75)  # 1 + 3 · 0.5²: slower at first
    assert growth(4.0, 1.65) == reference_params().rollout_growth


def test_demand_params_gives_the_asked_need_and_trainer_compute() -> None:
    p = demand_params(need_start=4.0, need_end=12.0, curve=2.0, slots=2, trainer_hours=20.0)
    assert p.need(0.0) == pytest.approx(4.0) and p.need(1.0) == pytest.approx(12.0)
    assert p.need(0.5) < (4.0 + 12.0) / 2  # the length grows late, so does the need
    n = 10_000  # the trainer's compute: steps × train_s × the mean of train_growth
    mean = sum(at(p.train_growth, (i + 0.5) / n) for i in range(n)) / n
    assert p.steps * p.train_s * mean / 3600 == pytest.approx(20.0, rel=2e-3)
    assert p.slots == 2 and p.batch_groups == reference_params().batch_groups
    # the reference scenario, given by its demand (4.75 -> 11.70 workers), is the same run
    ref = reference_params()
    same = demand_params(need_start=ref.need(0), need_end=ref.need(1))
    assert same.train_s == pytest.approx(ref.train_s, rel=5e-3)
    assert same.need(0.5) == pytest.approx(ref.need(0.5), rel=1e-3)
    with pytest.raises(ValueError, match="length_growth > 1"):
        demand_params(need_start=4.0, need_end=12.0, length_growth=1.0)


def test_target_line_takes_the_cheapest_auto_arm_within_the_wait() -> None:
    def row(label: str, wait: float, vs: float) -> Row:
        return Row(label=label, wait=wait, wait_time=wait, wall_h=1.0, rollout_h=1.0,
                   trainer_h=1.0, total_h=1.0 + vs, mean_pool=1.0, actions=0.0, seeds=1,
                   vs_best_fixed=vs)

    rows = [row("fixed 6", 0.3, 0.0), row("auto a", 0.04, -0.12), row("auto b", 0.06, -0.20)]
    assert target_line(rows).endswith("NOT met; best auto: auto a, -12.0% at 4.0%")
    rows.append(row("auto c", 0.05, -0.14))
    assert target_line(rows).endswith(": met; best auto: auto c, -14.0% at 5.0%")
    assert target_line(rows[:1]).endswith("NOT met; no auto arm within 5% wait")


def test_work_is_a_lower_bound_on_every_arm() -> None:
    # the work itself (rollout busy + trainer compute) is what a pool that wasted nothing
    # would cost: no fixed, automatic or oracle pool costs less
    params = reference_params(steps=60)
    arms = [*fixed_sweep(6, 11), *reference_arms()[2:]]
    for label, pol in arms:
        r = simulate(params, pol, seed=3)
        assert 0 < r.work_h <= r.total_h, label
        assert r.busy_h <= r.rollout_h, label
    with pytest.raises(ValueError, match="lo <= hi"):
        fixed_sweep(7, 6)


def test_baseline_lines_compare_the_best_auto_arm_with_every_fixed_pool() -> None:
    def row(label: str, wait: float, total: float, work: float = 80.0) -> Row:
        return Row(label=label, wait=wait, wait_time=wait, wall_h=1.0, rollout_h=1.0,
                   trainer_h=1.0, total_h=total, mean_pool=1.0, actions=0.0, seeds=1,
                   work_h=work)

    fixed = [row("fixed 6", 0.27, 120.0), row("fixed 8", 0.11, 100.0),
             row("fixed 10", 0.03, 110.0)]
    autos = [row("auto a", 0.04, 95.0, work=82.0), row("auto b", 0.08, 90.0)]
    lines = baseline_lines(fixed, autos)
    assert lines[0] == ("the cheapest fixed pool: fixed 8, 100.0 GPU-h at 11.0% wait; "
                        "-13% asks for 87.0 GPU-h; best auto (auto a, 4.0% wait): -5.0%")
    assert lines[1].startswith("the cheapest fixed pool within 5% wait: fixed 10, 110.0")
    assert lines[1].endswith("asks for 95.7 GPU-h; best auto (auto a, 4.0% wait): -13.6%")
    assert lines[2].endswith(": 80.0 GPU-h")
    # a saving that asks for less than the work is said to; no auto within the wait: no claim
    lines = baseline_lines(fixed[:2], autos[1:], saving=0.25)
    assert lines[0].endswith("asks for 75.0 GPU-h (less than the work itself)")
    assert len(lines) == 2 and "best auto" not in lines[0]
    with pytest.raises(ValueError, match="at least one fixed row"):
        baseline_lines([], autos)
