"""The scaling rule on known report streams: each zone, bounds, steps, hysteresis, cooldown,
the useful-lag zone, per-pool policies."""

from __future__ import annotations

import pytest

from astraflow.consumers.scaler.config import PoolConfig, ScaleConfig
from astraflow.consumers.scaler.rule import Rule, pool_load, zone_target
from astraflow.core.records import LoadReport, PolicyLoad


def report(w: float, produced: int = 64, consumed: int = 64, workers: int = 4, *,
           useful_lag: int = 0, ready: int = 0, horizon: int = 0,
           policies: list[PolicyLoad] | None = None) -> LoadReport:
    return LoadReport(run="r", window_start=0.0, window_end=10.0, trainer_step=10,
                      wait_ratio=w, produced=produced, consumed=consumed,
                      current_workers=workers, useful_lag=useful_lag, ready=ready,
                      horizon=horizon, tasks_lag=useful_lag, policies=policies or [])


def rule(**kw: object) -> Rule:
    pool = PoolConfig(min_workers=int(kw.pop("min_workers", 1)),  # type: ignore[call-overload]
                      max_workers=int(kw.pop("max_workers", 11)))  # type: ignore[call-overload]
    cfg = ScaleConfig(**{"confirm": 1, "cooldown_s": 0.0, "max_step_down": None, **kw})
    return Rule(cfg, "rollout", pool, batch_groups=8)


@pytest.mark.parametrize(("g", "w", "want"), [(6, 0.269, 9), (4, 0.5, 8), (1, 0.11, 2),
                                             (0, 0.9, 1), (10, 1.0, 200)])
def test_starved_zone_is_ceil_g_over_one_minus_w(g: int, w: float, want: int) -> None:
    zone, target, reason = zone_target(g, w, 10, 10, high=0.10, low=0.05, headroom=1.1)
    assert (zone, target) == ("starved", want)  # w is clamped at 0.95: 10/0.05 = 200
    assert "ceil" in reason


@pytest.mark.parametrize(("g", "produced", "consumed", "want"), [
    (10, 100, 50, 6),    # ceil(10 * 0.5 * 1.1) = 6
    (10, 100, 100, 10),  # ceil(11) capped at G
    (3, 90, 30, 2),      # ceil(3 * 1/3 * 1.1) = ceil(1.1) = 2
    (8, 80, 80, 8),
])
def test_idle_zone_is_min_g_ceil_ratio_headroom(g: int, produced: int, consumed: int,
                                                want: int) -> None:
    zone, target, _ = zone_target(g, 0.01, produced, consumed, high=0.10, low=0.05,
                                  headroom=1.1)
    assert (zone, target) == ("idle", want)


def test_idle_zone_counts_idle_slots_as_spare_capacity() -> None:
    # behind the gate an over-provisioned pool produces what the trainer consumes; half its
    # episode slots idle: it could produce twice as much
    zone, target, reason = zone_target(4, 0.01, 100, 100, high=0.10, low=0.05, headroom=1.1,
                                       utilization=0.5)
    assert (zone, target) == ("idle", 3) and "u=0.50" in reason  # ceil(4 * 0.5 * 1.1)
    assert zone_target(4, 0.01, 100, 100, high=0.10, low=0.05, headroom=1.1,
                       utilization=1.0)[1] == 4  # full: the reference's rule
    assert zone_target(4, 0.01, 100, 100, high=0.10, low=0.05, headroom=1.1,
                       utilization=0.0)[1] == 4  # unknown-like: not divided by zero
    assert zone_target(4, 0.01, 100, 100, high=0.10, low=0.05, headroom=1.1,
                       utilization=0.01)[1] == 1  # floor 0.05: ceil(4 * 0.05 * 1.1)


def test_balanced_zone_holds_and_an_empty_window_holds() -> None:
    assert zone_target(5, 0.07, 10, 3, high=0.10, low=0.05, headroom=1.1)[:2] == ("balanced", 5)
    assert zone_target(5, 0.0, 0, 0, high=0.10, low=0.05, headroom=1.1)[:2] == ("no-data", 5)
    # exactly on a boundary: hold (w > high scales up, w < low scales down)
    assert zone_target(5, 0.10, 10, 10, high=0.10, low=0.05, headroom=1.1)[0] == "balanced"
    assert zone_target(5, 0.05, 10, 1, high=0.10, low=0.05, headroom=1.1)[0] == "balanced"


def test_bounds_clip_both_ways() -> None:
    r = rule(min_workers=2, max_workers=6)
    d = r.decide(report(0.9, workers=5), now=0.0)
    assert (d.wanted, d.target, d.action) == (6, 6, "up")
    d = r.decide(report(0.0, produced=100, consumed=1, workers=3), now=1.0)
    assert (d.wanted, d.target, d.action) == (2, 2, "down")


def test_out_of_bounds_pool_comes_back_within_bounds() -> None:
    r = rule(min_workers=2, max_workers=6)
    d = r.decide(report(0.07, workers=9), now=0.0)  # balanced, but 9 > max
    assert d.target == 6 and "outside" in d.reason


def test_step_limits() -> None:
    r = rule(max_step_up=2, max_step_down=1)
    assert r.decide(report(0.5, workers=2), now=0.0).target == 4  # wanted 4: within 2
    assert r.decide(report(0.8, workers=2), now=1.0).target == 4  # wanted 10: +2
    assert r.decide(report(0.0, produced=100, consumed=10, workers=8), now=2.0).target == 7


def test_hysteresis_needs_confirm_reports_in_a_row() -> None:
    r = rule(confirm=3)
    starved = report(0.3, workers=4)
    d1 = r.decide(starved, now=0.0)
    d2 = r.decide(starved, now=1.0)
    assert (d1.target, d2.target) == (4, 4) and "2 so far" in d2.reason
    assert r.decide(starved, now=2.0).target == 6
    # a report that wants the other way breaks the streak
    r = rule(confirm=2)
    assert r.decide(starved, now=0.0).target == 4
    assert r.decide(report(0.07, workers=4), now=1.0).target == 4  # hold
    assert r.decide(starved, now=2.0).target == 4  # the streak starts again
    assert r.decide(starved, now=3.0).target == 6


def test_cooldown_after_an_action() -> None:
    r = rule(cooldown_s=60.0)
    assert r.decide(report(0.3, workers=4), now=0.0).target == 6
    d = r.decide(report(0.3, workers=6), now=30.0)
    assert d.target == 6 and d.wanted == 9 and "cooling down" in d.reason
    assert r.decide(report(0.3, workers=6), now=61.0).target == 9


def test_a_shorter_cooldown_before_scaling_up() -> None:
    r = rule(cooldown_s=60.0, up_cooldown_s=5.0)
    assert r.decide(report(0.0, produced=100, consumed=10, workers=4), now=0.0).target == 1
    assert r.decide(report(0.5, workers=1), now=3.0).target == 1  # 3 s < 5 s
    assert r.decide(report(0.5, workers=1), now=6.0).target == 2  # up: 5 s is enough
    d = r.decide(report(0.0, produced=100, consumed=10, workers=2), now=30.0)
    assert d.target == 2 and "of 60s" in d.reason  # down: the full cooldown


def test_the_actuators_count_wins_over_the_reports() -> None:
    d = rule().decide(report(0.5, workers=1), now=0.0, current=4)
    assert (d.current, d.target) == (4, 8)


def test_useful_lag_scales_up_before_the_trainer_waits() -> None:
    # w in the hold zone; less than one batch (8 groups) ready; rollout produces 48 of the
    # 64 the trainer consumed: the ready backlog drains, the trainer will starve
    draining = report(0.07, produced=48, consumed=64, workers=3, useful_lag=30, ready=2,
                      horizon=32)
    d = rule().decide(draining, now=0.0)
    assert (d.zone, d.target) == ("draining", 4)  # ceil(3 * 64/48)
    assert rule(use_useful_lag=False).decide(draining, now=0.0).target == 3
    # enough ready ahead of the trainer: no anticipation, the idle rule applies
    plenty = report(0.01, produced=48, consumed=64, workers=3, useful_lag=10, ready=22,
                    horizon=32)
    d = rule().decide(plenty, now=0.0)
    assert d.zone == "idle" and d.target == 3


def test_pool_of_named_policies_uses_their_largest_wait() -> None:
    rep = report(0.6, policies=[
        PolicyLoad(policy="solver", wait_ratio=0.02, trainer_step=3, produced=10, consumed=5),
        PolicyLoad(policy="verifier", wait_ratio=0.6, trainer_step=2, produced=4, consumed=4)])
    assert pool_load(rep, PoolConfig(policies=["solver"])) == (0.02, 10, 5)
    assert pool_load(rep, PoolConfig()) == (0.6, 14, 9)
    assert pool_load(report(0.2), PoolConfig(policies=["x"])) == (0.2, 64, 64)


def test_every_decision_carries_its_inputs() -> None:
    d = rule().decide(report(0.3, workers=4, useful_lag=5, ready=3, horizon=40), now=7.0)
    assert d.inputs["w"] == 0.3 and d.inputs["useful_lag"] == 5 and d.inputs["horizon"] == 40
    line = d.as_dict()
    assert line["action"] == "up" and line["ts"] == 7.0 and line["pool"] == "rollout"


def test_config_refuses_bad_zones_bounds_and_two_local_pools() -> None:
    with pytest.raises(ValueError, match="low_wait"):
        ScaleConfig(low_wait=0.2, high_wait=0.1)
    with pytest.raises(ValueError, match="min_workers"):
        PoolConfig(min_workers=5, max_workers=2)
    with pytest.raises(ValueError, match="local actuator"):
        ScaleConfig(pools={"a": PoolConfig(), "b": PoolConfig()})
    with pytest.raises(ValueError, match="needs `command`"):
        ScaleConfig(pools={"a": PoolConfig(actuator={"type": "command"})})  # type: ignore[arg-type]
