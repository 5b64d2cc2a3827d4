"""A discrete-event model of a run with the scaler in the loop (``bench/elastic_sim.py``,
``bench/elastic_fit.py``; docs/elastic-sim.md has the long form). It runs on the replay
simulator's event clock (:class:`astraflow.sim.events.Events`): each process below is a chain
of callbacks on it.

**Trainer.** ``steps`` steps; each needs ``batch_groups`` (B) finished groups and lasts a
gamma-distributed time (mean ``train_s`` × ``train_growth`` at the run's progress, coefficient
of variation ``train_cv``). It waits while fewer than B groups are ready; that time is its
wait. The policy version goes up by one at the end of a step.

**Rollout.** Workers of ``slots`` concurrent groups each; a group takes a lognormal time (mean
``group_s`` × ``rollout_growth`` at the progress when it starts, log-sd ``group_sigma``: a
long tail). ``rollout_growth`` rising faster than ``train_growth`` is the changing demand of a
real run: responses grow longer as RL goes on, and generation slows with length faster than a
training step does, so the pool the trainer needs grows over the run.

**Staleness gate.** A task is released only while ``released <= (version + k + 1) · B``
(AReaL's rule, :mod:`astraflow.policies.gate`): groups in flight, ready and in training stay
within the horizon ``(k + 1) · B``. Workers take released tasks in order.

**Workers** asked for become useful ``start_delay_s`` later and cost from the moment they are
asked for; a worker scaled down takes no new task and is released when its current groups
finish (graceful drain: no work lost); one still starting is cancelled first, an idle one
before a busy one.

**Reporter.** Every ``report_every_steps`` trainer steps (the ``scale`` section's under
:class:`Auto`) a real
:class:`~astraflow.core.records.LoadReport`: wait ratio over the window (the trainer's wait
over wait plus busy), produced and consumed (groups), healthy workers, ``tasks_lag``
(released, not finished), ``ready``, ``horizon``, ``useful_lag`` and ``utilization``: as the
real reporter measures it (each worker's mean ``inflight / max_inflight`` over its heartbeats,
averaged over the healthy workers), each running worker's time-weighted share of busy slots
over the part of the window it ran, averaged over the workers still there. A slot is busy
while it generates a group; a worker idle because the gate released no task is running and
not busy; a worker's time starting up (no heartbeat yet) or draining (not ``running``) is not
counted.

**Policies.** :class:`Fixed` (no scaler); :class:`Auto`: the real
:class:`~astraflow.consumers.scaler.rule.Rule` decides on each report, and its target is
applied (``current`` is the pool's asked-for size, as the actuator counts it); :class:`Lag`:
a KEDA-style scaler, ``ceil(lag / per_worker)`` polled every ``poll_s``, scaling up at once
and down to the largest wish of the last ``stabilization_s`` (the HPA's window).

Everything is drawn from ``random.Random`` streams seeded by ``seed`` (trainer and rollout
apart, and per group by release order), so a seed gives the same run, and two policies with
one seed see the same step and group times.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from astraflow.consumers.scaler.config import PoolConfig, ScaleConfig
from astraflow.consumers.scaler.rule import Rule
from astraflow.core.records import LoadReport, PolicyLoad
from astraflow.sim.events import Events

#: a piecewise-linear multiplier over the run's progress (trainer step / steps), as points
Schedule = tuple[tuple[float, float], ...]
FLAT: Schedule = ((0.0, 1.0), (1.0, 1.0))


def at(schedule: Schedule, p: float) -> float:
    """The schedule's multiplier at progress ``p`` (flat beyond its first and last points)."""
    pts = sorted(schedule)
    if p <= pts[0][0]:
        return pts[0][1]
    for (p0, m0), (p1, m1) in zip(pts, pts[1:], strict=False):
        if p <= p1:
            return m0 + (m1 - m0) * (p - p0) / (p1 - p0) if p1 > p0 else m1
    return pts[-1][1]


@dataclass(frozen=True)
class SimParams:
    """A run's shape. Times in seconds."""

    steps: int = 300
    batch_groups: int = 32  # B: groups per trainer step
    max_staleness: int = 2  # k: horizon (k + 1) · B
    train_s: float = 140.0  # trainer step time at progress 0 (mean)
    train_cv: float = 0.05
    train_growth: Schedule = FLAT
    group_s: float = 105.0  # one group's rollout time at progress 0 (mean), per slot
    group_sigma: float = 0.5  # lognormal log-sd of a group's time (its long tail)
    rollout_growth: Schedule = FLAT
    slots: int = 4  # groups a worker runs at once
    start_delay_s: float = 300.0  # asked for -> useful
    trainer_gpus: int = 4  # held throughout (counted in the total)
    report_every_steps: int = 10
    # fill LoadReport.utilization; False leaves it -1 (unknown), as a reporter without it:
    # the rule's idle zone then reads produced alone (the rule before utilization)
    report_utilization: bool = True
    run: str = "sim"

    @property
    def horizon(self) -> int:
        return (self.max_staleness + 1) * self.batch_groups

    def need(self, p: float) -> float:
        """Workers that exactly keep up with the trainer at progress ``p`` (no noise)."""
        return (self.batch_groups * self.group_s * at(self.rollout_growth, p)
                / (self.slots * self.train_s * at(self.train_growth, p)))


@dataclass(frozen=True)
class Fixed:
    """A fixed pool, no scaler."""

    workers: int


@dataclass(frozen=True)
class Auto:
    """The scaler's rule on the reporter's reports (pool ``rollout`` of ``scale``)."""

    scale: ScaleConfig
    initial: int | None = None  # None: the pool's min_workers

    @property
    def pool(self) -> PoolConfig:
        return next(iter(self.scale.pools.values()))


@dataclass(frozen=True)
class Lag:
    """A KEDA-style scaler on a lag: ``ceil(lag / per_worker)`` within the bounds."""

    signal: Literal["tasks_lag", "useful_lag"]
    per_worker: float
    min_workers: int
    max_workers: int
    poll_s: float = 30.0
    stabilization_s: float = 300.0
    initial: int | None = None


@dataclass(frozen=True)
class Oracle:
    """A bound, not a scaler: knows the demand curve (:meth:`SimParams.need`) and after every
    trainer step asks for the cheapest whole pool for the need ``start_delay_s`` ahead: the
    one below it (the trainer waits ``f / n``) when that costs less than a worker idling for
    the fraction ``1 - f`` and waits at most ``max_wait``, else the one above."""

    min_workers: int
    max_workers: int
    max_wait: float = 0.05


Policy = Fixed | Auto | Lag | Oracle


@dataclass
class Result:
    """One simulated run. Hours are wall-clock; ``rollout_h`` and ``trainer_h`` are
    worker-hours (GPU-hours where a worker is one GPU)."""

    wall_h: float
    rollout_h: float
    busy_h: float  # rollout worker-hours spent on groups (slot time / slots)
    trainer_h: float
    wait: float  # mean of the reports' wait ratios (the reporter's view)
    wait_time: float  # trainer wait / wall time
    actions: int  # scale actions (changes of the asked-for size)
    released: int
    produced: int
    consumed: int
    consumed_unique: int
    left_ready: int
    left_in_flight: int
    reports: list[LoadReport] = field(default_factory=list)
    series: list[tuple[float, int, int]] = field(default_factory=list)  # (h, asked, useful)

    @property
    def total_h(self) -> float:
        return self.rollout_h + self.trainer_h

    @property
    def mean_pool(self) -> float:
        return self.rollout_h / self.wall_h if self.wall_h else 0.0

    @property
    def work_h(self) -> float:
        """The work itself: rollout worker-hours spent generating groups and the trainer's
        GPU-hours computing (not waiting). A pool that wasted nothing would cost this."""
        return self.busy_h + self.trainer_h * (1.0 - self.wait_time)


@dataclass
class _Worker:
    asked: float
    up: bool = False
    draining: bool = False
    busy: int = 0
    gone: float | None = None
    # the report window so far: seconds running (up, not draining, not gone) and the
    # integral of busy / slots over them; `since` is when they were last brought up to date
    since: float = 0.0
    run_s: float = 0.0
    busy_s: float = 0.0

    @property
    def running(self) -> bool:
        return self.up and not self.draining and self.gone is None

    def tick(self, now: float, slots: int) -> None:
        """Bring the window's running and busy time up to ``now`` (before any change of
        ``busy``, ``up``, ``draining`` or ``gone``)."""
        if self.running:
            dt = now - self.since
            self.run_s += dt
            self.busy_s += dt * self.busy / slots
        self.since = now


class _Sim:
    def __init__(self, params: SimParams, policy: Policy, seed: int) -> None:
        self.p, self.policy = params, policy
        self.clock = Events()
        self.train_rng = random.Random(f"train-{seed}")
        self.group_rng = random.Random(f"rollout-{seed}")
        self.workers: list[_Worker] = []
        self.queue: deque[tuple[int, float]] = deque()  # (group id, its lognormal factor)
        self.ready: deque[int] = deque()
        self.released = self.finished = self.version = 0
        self.consumed: list[int] = []
        self.wait_s = self.busy_s = self.slot_s = 0.0
        self.window = (0.0, 0.0, 0.0, 0, 0)  # start, wait_s, busy_s, produced, consumed
        self.reports: list[LoadReport] = []
        self.series: list[tuple[float, int, int]] = []
        self.actions = 0
        self.step = 0  # the trainer's next step
        self.waiting_since: float | None = None  # the trainer waits for groups since then
        self.done = False
        self.rule = (Rule(policy.scale, "rollout", policy.pool, params.batch_groups)
                     if isinstance(policy, Auto) else None)
        self.wishes: deque[tuple[float, int]] = deque()
        # the scaler's own cadence (scale.report_every_steps) when it is in the loop
        self.every = (policy.scale.report_every_steps if isinstance(policy, Auto)
                      else params.report_every_steps)

    # -- pool ---------------------------------------------------------------------------
    def asked(self) -> int:
        return sum(1 for w in self.workers if w.gone is None and not w.draining)

    def useful(self) -> int:
        return sum(1 for w in self.workers if w.gone is None and w.up and not w.draining)

    def scale_to(self, target: int) -> None:
        current = self.asked()
        if target == current:
            return
        self.actions += 1
        now = self.clock.now
        if target > current:
            for _ in range(target - current):
                w = _Worker(asked=now)
                self.workers.append(w)
                self.clock.after(self.p.start_delay_s, self._started, w)
        else:
            live = [w for w in self.workers if w.gone is None and not w.draining]
            live.sort(key=lambda w: (w.up, w.busy, -w.asked))  # starting, idle, least busy
            for w in live[:current - target]:
                w.tick(now, self.p.slots)
                w.draining = True
                if w.busy == 0:
                    w.gone = now
        self._mark()

    def _started(self, w: _Worker) -> None:
        if w.gone is None and not w.draining:
            w.tick(self.clock.now, self.p.slots)
            w.up = True
            self._mark()
            self.dispatch()

    def _mark(self) -> None:
        self.series.append((self.clock.now / 3600, self.asked(), self.useful()))

    # -- tasks --------------------------------------------------------------------------
    def release(self) -> None:
        cap = (self.version + self.p.max_staleness + 1) * self.p.batch_groups
        while self.released < cap:
            factor = self.group_rng.lognormvariate(-self.p.group_sigma ** 2 / 2,
                                                   self.p.group_sigma)
            self.queue.append((self.released, factor))
            self.released += 1
        self.dispatch()

    def dispatch(self) -> None:
        for w in self.workers:
            while (self.queue and w.up and not w.draining and w.gone is None
                   and w.busy < self.p.slots):
                gid, factor = self.queue.popleft()
                w.tick(self.clock.now, self.p.slots)
                w.busy += 1
                mean = self.p.group_s * at(self.p.rollout_growth, self.version / self.p.steps)
                self.clock.after(mean * factor, self._generated, w, gid, self.clock.now)

    def _generated(self, w: _Worker, gid: int, start: float) -> None:
        if self.done:
            return
        self.slot_s += self.clock.now - start
        w.tick(self.clock.now, self.p.slots)
        w.busy -= 1
        self.finished += 1
        self.ready.append(gid)
        if w.draining and w.busy == 0:
            w.gone = self.clock.now
        if self.waiting_since is not None and len(self.ready) >= self.p.batch_groups:
            self.clock.at(self.clock.now, self._fed)  # after this event, as a woken process
        self.dispatch()

    # -- trainer and reporter -----------------------------------------------------------
    def trainer(self) -> None:
        """The trainer, idle: its next step if ``batch_groups`` groups are ready, else wait
        for them (:meth:`_generated` wakes it); the end of the run after the last step."""
        if self.step == self.p.steps:
            self.done = True
        elif len(self.ready) < self.p.batch_groups:
            self.waiting_since = self.clock.now
        else:
            self._train()

    def _fed(self) -> None:
        if self.waiting_since is None:
            return  # woken twice in one instant (two groups finished at once): fed already
        self.wait_s += self.clock.now - self.waiting_since
        self.waiting_since = None
        self._train()

    def _train(self) -> None:
        p = self.p
        self.consumed.extend(self.ready.popleft() for _ in range(p.batch_groups))
        mean = p.train_s * at(p.train_growth, self.step / p.steps)
        shape = 1.0 / p.train_cv ** 2
        seconds = self.train_rng.gammavariate(shape, mean / shape)
        self.clock.after(seconds, self._trained, seconds)

    def _trained(self, seconds: float) -> None:
        p, step = self.p, self.step
        self.busy_s += seconds
        self.version += 1
        self.release()
        if isinstance(self.policy, Oracle) and step + 1 < p.steps:
            self.scale_to(self.oracle(self.policy, seconds))
        if (step + 1) % self.every == 0 or step + 1 == p.steps:
            self.report()
        self.step += 1
        self.trainer()

    def report(self) -> None:
        p, now = self.p, self.clock.now
        start, wait0, busy0, produced0, consumed0 = self.window
        dw, db = self.wait_s - wait0, self.busy_s - busy0
        produced, consumed = self.finished - produced0, len(self.consumed) - consumed0
        w = dw / (dw + db) if dw + db > 0 else 0.0
        tasks_lag, ready = self.released - self.finished, len(self.ready)
        u = self.utilization()  # always: it also starts the workers' next window
        rec = LoadReport(
            run=p.run, seq=len(self.reports), window_start=start, window_end=now,
            trainer_step=self.version, wait_ratio=w, produced=produced, consumed=consumed,
            policies=[PolicyLoad(policy="policy", wait_ratio=w, trainer_step=self.version,
                                 produced=produced, consumed=consumed,
                                 steps=consumed // p.batch_groups)],
            current_workers=self.useful(), tasks_lag=tasks_lag, ready=ready,
            horizon=p.horizon, useful_lag=min(tasks_lag, max(0, p.horizon - ready)),
            utilization=u if p.report_utilization else -1.0)
        self.reports.append(rec)
        self.window = (now, self.wait_s, self.busy_s, self.finished, len(self.consumed))
        if self.rule is not None and self.version < p.steps:
            self.scale_to(self.rule.decide(rec, now, self.asked()).target)

    def utilization(self) -> float:
        """The window's busy share of the running workers' slots (the mean of each one's
        over the time it ran; -1: none ran), and a new window."""
        now, shares = self.clock.now, []
        for w in self.workers:
            w.tick(now, self.p.slots)
            if w.gone is None and w.run_s > 0:
                shares.append(w.busy_s / w.run_s)
            w.run_s = w.busy_s = 0.0
        return sum(shares) / len(shares) if shares else -1.0

    def oracle(self, pol: Oracle, step_s: float) -> int:
        p = self.p
        ahead = self.version + p.start_delay_s / step_s
        n = p.need(min(1.0, ahead / p.steps))
        lo = max(1, math.floor(n))
        f = n - lo
        under = p.trainer_gpus * f / lo < 1 - f and f / n <= pol.max_wait
        return max(pol.min_workers, min(pol.max_workers, lo if under or f == 0 else lo + 1))

    def lag_scaler(self, pol: Lag) -> None:
        """One poll of the KEDA-style scaler; the next one is due ``poll_s`` later."""
        if self.done:
            return
        self.clock.after(pol.poll_s, self.lag_scaler, pol)
        tasks_lag, ready = self.released - self.finished, len(self.ready)
        lag = (tasks_lag if pol.signal == "tasks_lag"
               else min(tasks_lag, max(0, self.p.horizon - ready)))
        want = max(pol.min_workers, min(pol.max_workers, math.ceil(lag / pol.per_worker)))
        now = self.clock.now
        self.wishes.append((now, want))
        while self.wishes[0][0] < now - pol.stabilization_s:
            self.wishes.popleft()
        current = self.asked()
        if want > current:
            self.scale_to(want)
        elif want < current:
            self.scale_to(max(max(w for _, w in self.wishes), want))

    # -- the run ------------------------------------------------------------------------
    def run(self) -> Result:
        pol = self.policy
        if isinstance(pol, Fixed):
            initial = pol.workers
        elif isinstance(pol, Auto):
            initial = pol.initial if pol.initial is not None else pol.pool.min_workers
        elif isinstance(pol, Lag):
            initial = pol.initial if pol.initial is not None else pol.min_workers
        else:
            initial = self.oracle(pol, self.p.train_s * at(self.p.train_growth, 0.0))
        self.workers = [_Worker(asked=0.0, up=True) for _ in range(initial)]
        self._mark()
        self.clock.at(0.0, self.trainer)
        if isinstance(pol, Lag):
            self.clock.after(pol.poll_s, self.lag_scaler, pol)
        self.release()
        self.clock.run(stop=lambda: self.done)
        end = self.clock.now
        self._mark()
        in_flight = sum(w.busy for w in self.workers if w.gone is None)
        rollout_s = sum((w.gone if w.gone is not None else end) - w.asked for w in self.workers)
        reports = self.reports
        return Result(
            wall_h=end / 3600, rollout_h=rollout_s / 3600, busy_h=self.slot_s / self.p.slots / 3600,
            trainer_h=self.p.trainer_gpus * end / 3600,
            wait=sum(r.wait_ratio for r in reports) / len(reports) if reports else 0.0,
            wait_time=self.wait_s / end if end else 0.0, actions=self.actions,
            released=self.released, produced=self.finished, consumed=len(self.consumed),
            consumed_unique=len(set(self.consumed)), left_ready=len(self.ready),
            left_in_flight=in_flight + len(self.queue), reports=reports, series=self.series)


def simulate(params: SimParams, policy: Policy, seed: int = 0) -> Result:
    """One run of ``params`` under ``policy``; deterministic given ``seed``."""
    return _Sim(params, policy, seed).run()
