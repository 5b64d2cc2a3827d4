"""The scaling rule (docs/elastic.md#the-rule): from a :class:`LoadReport` to a target pool size.

Zones on the largest trainer wait ratio ``w`` of the pool's policies: starved
(``w > high_wait``) grows the pool, idle (``w < low_wait``) shrinks it, draining
(``use_useful_lag``: less than a batch ready, rollout slower than the trainer) grows it before
the trainer starves, balanced holds; then bounds, step limits, hysteresis (``confirm``) and
cooldowns apply. :class:`Rule` keeps the state (last action, streak of wishes) and is otherwise
pure, so tests drive it with report streams and a clock.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from astraflow.consumers.scaler.config import PoolConfig, ScaleConfig
from astraflow.core.records import LoadReport

#: w is clamped below this in ceil(G / (1 - w)) (a fully starved trainer would divide by 0)
MAX_WAIT = 0.95


@dataclass(frozen=True)
class Decision:
    """What the rule made of one report, with every input it used (logged and put on
    ``metrics``)."""

    pool: str
    ts: float
    current: int
    wanted: int  # the zone's target within the bounds, before hysteresis and cooldown
    target: int  # what the scaler asks the actuator for (== current: no action)
    zone: str  # starved, idle, balanced, draining, no-data
    reason: str
    inputs: dict[str, float] = field(default_factory=dict)

    @property
    def action(self) -> str:
        return "up" if self.target > self.current else (
            "down" if self.target < self.current else "hold")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "action": self.action}


def pool_load(report: LoadReport, pool: PoolConfig) -> tuple[float, int, int]:
    """(w, produced, consumed) of the policies ``pool`` feeds: the largest wait ratio and the
    sums; the report's own totals when the pool names no policy or the report has none."""
    mine = [p for p in report.policies if not pool.policies or p.policy in pool.policies]
    if not mine:
        return report.wait_ratio, report.produced, report.consumed
    return (max(p.wait_ratio for p in mine), sum(p.produced for p in mine),
            sum(p.consumed for p in mine))


def zone_target(g: int, w: float, produced: int, consumed: int, *, high: float, low: float,
                headroom: float, utilization: float = -1.0) -> tuple[str, int, str]:
    """The three-zone rule alone: (zone, target, reason), unbounded. ``utilization`` (the busy
    share of the pool's episode slots, -1: unknown) turns ``produced`` into what the pool
    could have produced: behind the staleness gate an over-provisioned pool produces no more
    than the trainer consumes (the gate releases no more), so ``consumed/produced`` stays
    near 1 and the pool's spare capacity shows only as idle slots."""
    if w > high:
        t = max(g + 1, math.ceil(g / (1.0 - min(w, MAX_WAIT)) - 1e-9))
        return "starved", t, f"w={w:.3f} > {high}: ceil({g}/(1-w)) = {t}"
    if w < low:
        if produced <= 0:
            return "no-data", g, f"w={w:.3f} < {low} but nothing produced in the window: hold"
        capacity, of = float(produced), f"{produced}"
        if 0.0 < utilization < 1.0:
            capacity, of = produced / max(utilization, 0.05), f"({produced}/u={utilization:.2f})"
        t = min(g, math.ceil(g * consumed / capacity * headroom - 1e-9))
        return "idle", t, (f"w={w:.3f} < {low}: min({g}, ceil({g}*{consumed}/{of}"
                           f"*{headroom})) = {t}")
    return "balanced", g, f"{low} <= w={w:.3f} <= {high}: hold"


class Rule:
    """The rule of one pool, with its hysteresis and cooldown state."""

    def __init__(self, config: ScaleConfig, name: str, pool: PoolConfig,
                 batch_groups: int = 1) -> None:
        self.config = config
        self.name = name
        self.pool = pool
        self.batch_groups = max(1, batch_groups)  # B of the pool's policies, for the lag rule
        self.last_action: float | None = None
        self._streak: tuple[str, int] = ("hold", 0)

    def bound(self, n: int) -> int:
        return max(self.pool.min_workers, min(self.pool.max_workers, n))

    def decide(self, report: LoadReport, now: float, current: int | None = None) -> Decision:
        """The decision for ``report`` at time ``now``; ``current`` is the pool's size (the
        actuator's count), else the report's count of healthy workers."""
        c = self.config
        g = report.current_workers if current is None else current
        w, produced, consumed = pool_load(report, self.pool)
        zone, raw, reason = zone_target(g, w, produced, consumed, high=c.high_wait,
                                        low=c.low_wait, headroom=c.headroom,
                                        utilization=report.utilization)
        short = report.horizon > 0 and report.useful_lag > report.horizon - self.batch_groups
        if (c.use_useful_lag and zone in ("balanced", "idle") and short
                and 0 < produced < consumed):
            raw = max(g, math.ceil(g * consumed / produced - 1e-9))
            zone, reason = "draining", (
                f"useful_lag={report.useful_lag} > horizon-B={report.horizon}"
                f"-{self.batch_groups} (ready {report.ready} < one batch) and produced "
                f"{produced} < consumed {consumed}: ceil({g}*{consumed}/{produced}) = {raw}")
        wanted = self.bound(raw)
        if g < self.pool.min_workers or g > self.pool.max_workers:
            wanted = self.bound(g)  # out of bounds (a hand-started worker): back within them
            reason += f"; {g} is outside [{self.pool.min_workers}, {self.pool.max_workers}]"
        step = c.max_step_up if wanted > g else c.max_step_down
        if step is not None and abs(wanted - g) > step:
            wanted = g + step if wanted > g else g - step
        inputs = {"w": w, "produced": float(produced), "consumed": float(consumed),
                  "tasks_lag": float(report.tasks_lag), "useful_lag": float(report.useful_lag),
                  "ready": float(report.ready), "horizon": float(report.horizon),
                  "healthy_workers": float(report.current_workers),
                  "utilization": report.utilization,
                  "trainer_step": float(report.trainer_step)}
        direction = "up" if wanted > g else ("down" if wanted < g else "hold")
        name, n = self._streak
        self._streak = (direction, n + 1 if name == direction else 1)
        target = wanted
        cooldown = c.cooldown_s if direction != "up" or c.up_cooldown_s is None \
            else c.up_cooldown_s
        if direction != "hold":
            if self._streak[1] < c.confirm:
                target = g
                reason += f"; waiting for {c.confirm} reports in a row ({self._streak[1]} so far)"
            elif self.last_action is not None and now - self.last_action < cooldown:
                target = g
                reason += (f"; cooling down ({now - self.last_action:.0f}s of "
                           f"{cooldown:.0f}s since the last action)")
        if target != g:
            self.last_action = now
            self._streak = ("hold", 0)
        return Decision(pool=self.name, ts=now, current=g, wanted=wanted, target=target,
                        zone=zone, reason=reason, inputs=inputs)
