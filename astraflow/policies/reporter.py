"""The reporter (docs/elastic.md#the-load-report, `astraflow report`): reads every process's
heartbeats on ``metrics`` and the run's consumer-group lags, and writes a :class:`LoadReport` to
``reports`` every ``every_steps`` trainer steps (and after ``every_s`` seconds without one, so a
starved trainer is still reported).

A report covers the window since the previous one: per policy, per rollout process, and the
lags (``tasks_lag``, ``ready``, ``horizon``, ``useful_lag``) an autoscaler acts on. Counters are
deltas against each process's first heartbeat the reporter heard, so a restarted reporter or a
process that joins mid-window counts only what it did since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from astraflow.core.bus.types import Bus
from astraflow.core.errors import BusError, SchemaError
from astraflow.core.metrics import MetricsEmitter, named_policy
from astraflow.core.records import LoadReport, Metric, PolicyLoad, WorkerStatus, decode
from astraflow.core.stream import Output, Stop, send
from astraflow.core.topics import group_name, record_key, topic_name

log = logging.getLogger("astraflow.reporter")

#: a stopped or failed rollout process is listed in reports for this many seconds
GONE_AFTER_S = 60.0


@dataclass
class _Seen:
    """One process as heard: its newest heartbeat and its counters at the window's start."""

    metric: Metric
    base: dict[str, float]  # counters at the start of the current window (or first heard)
    base_ts: float
    busy: list[float] = field(default_factory=list)  # inflight / max_inflight per heartbeat


@dataclass
class ReporterSettings:
    """What the reporter needs of the experiment (handed over by the code composing roles)."""

    run: str
    policies: list[str]
    batch_groups: dict[str, int]  # B per policy
    max_staleness: dict[str, int]  # per policy
    group_size: int = 1  # trajectories per group (n_samples), to count lags in groups
    rollout_group: str | None = None  # the rollout consumer group (default: the run's)
    every_steps: int = 10
    every_s: float | None = 30.0
    heartbeat_timeout_s: float = 15.0
    min_window_s: float = 0.0  # no report on a window shorter than this


@dataclass
class Reporter:
    """Keeps the view of the run's processes and builds reports from it."""

    settings: ReporterSettings
    seq: int = 0
    seen: dict[str, _Seen] = field(default_factory=dict)
    window_start: float = field(default_factory=time.time)
    last_step: int = 0  # the trainer step of the newest report

    def observe(self, m: Metric) -> None:
        s = self.seen.get(m.component)
        if s is None:
            s = self.seen[m.component] = _Seen(m, dict(m.counters), m.ts)
        elif m.ts >= s.metric.ts:
            s.metric = m
        else:
            return
        cap = m.gauges.get("max_inflight", 0.0)
        if cap > 0 and m.status == "running":
            s.busy.append(min(1.0, m.gauges.get("inflight", 0.0) / cap))

    def policy_of(self, m: Metric) -> str | None:
        named = named_policy(m)
        if named in self.settings.policies:
            return named
        return self.settings.policies[0] if len(self.settings.policies) == 1 else None

    def trainer_step(self) -> int:
        return max((int(s.metric.gauges.get("step", 0)) for s in self.seen.values()
                    if s.metric.role == "trainer"), default=0)

    def steps(self) -> dict[str, int]:
        """Each policy's newest trainer step."""
        out: dict[str, int] = {}
        for s in self.seen.values():
            p = self.policy_of(s.metric) if s.metric.role == "trainer" else None
            if p is not None:
                out[p] = max(out.get(p, 0), int(s.metric.gauges.get("step", 0)))
        return out

    def due(self, now: float) -> bool:
        if now - self.window_start < self.settings.min_window_s:
            return False  # shorter than a few heartbeats: counters would be noise
        step = self.trainer_step()
        if step >= self.last_step + self.settings.every_steps:
            return True
        every = self.settings.every_s
        return every is not None and now - self.window_start >= every

    def _delta(self, s: _Seen, name: str) -> float:
        return max(0.0, s.metric.counters.get(name, 0.0) - s.base.get(name, 0.0))

    def build(self, now: float, *, tasks_lag: int, ready: int) -> LoadReport:
        """The report of the window ending ``now``; starts the next window."""
        st = self.settings
        loads = []
        for p in st.policies:
            trainers = [s for s in self.seen.values()
                        if s.metric.role == "trainer" and self.policy_of(s.metric) == p]
            wait = sum(self._delta(s, "wait_s") for s in trainers)
            busy = sum(self._delta(s, "busy_s") for s in trainers)
            produced = sum(self._delta(s, f"trajectories.{p}") for s in self.seen.values()
                           if s.metric.role == "rollout")
            loads.append(PolicyLoad(
                policy=p, wait_ratio=wait / (wait + busy) if wait + busy > 0 else 0.0,
                trainer_step=max((int(s.metric.gauges.get("step", 0)) for s in trainers),
                                 default=0),
                produced=int(produced),
                consumed=int(sum(self._delta(s, "trajectories") for s in trainers)),
                steps=int(sum(self._delta(s, "steps") for s in trainers))))
        workers = self._workers(now)
        horizon = sum((st.max_staleness.get(p, 0) + 1) * st.batch_groups.get(p, 1)
                      for p in st.policies)
        report = LoadReport(
            run=st.run, seq=self.seq, window_start=self.window_start, window_end=now,
            trainer_step=self.trainer_step(),
            wait_ratio=max((x.wait_ratio for x in loads), default=0.0),
            produced=sum(x.produced for x in loads), consumed=sum(x.consumed for x in loads),
            policies=loads, workers=workers,
            current_workers=sum(1 for w in workers if w.healthy and w.status == "running"),
            tasks_lag=tasks_lag, ready=ready, horizon=horizon,
            useful_lag=min(tasks_lag, max(0, horizon - ready)),
            utilization=_mean([w.utilization for w in workers
                               if w.healthy and w.utilization >= 0], -1.0))
        self._next_window(now, report.trainer_step)
        return report

    def _workers(self, now: float) -> list[WorkerStatus]:
        out = []
        for s in self.seen.values():
            m = s.metric
            if m.role != "rollout":
                continue
            gone = m.status in ("stopped", "failed")
            if gone and now - m.ts > GONE_AFTER_S:
                continue
            span = max(m.ts - s.base_ts, 1e-9)
            out.append(WorkerStatus(
                component=m.component, host=m.host, status=m.status,
                episodes_per_s=self._delta(s, "episodes") / span if m.ts > s.base_ts else 0.0,
                last_seen=m.ts,
                healthy=not gone and now - m.ts <= self.settings.heartbeat_timeout_s,
                utilization=sum(s.busy) / len(s.busy) if s.busy else -1.0))
        return sorted(out, key=lambda w: w.component)

    def _next_window(self, now: float, step: int) -> None:
        self.seq += 1
        self.window_start = now
        self.last_step = step
        for c, s in list(self.seen.items()):
            if s.metric.status in ("stopped", "failed") and now - s.metric.ts > GONE_AFTER_S:
                del self.seen[c]
                continue
            s.base, s.base_ts = dict(s.metric.counters), s.metric.ts
            s.busy = []


def _mean(xs: list[float], empty: float) -> float:
    return sum(xs) / len(xs) if xs else empty


def _lag(bus: Bus, group: str, topic: str) -> int:
    try:
        return sum(bus.lag(group, topic).values())
    except BusError:
        return 0


def measure_lags(bus: Bus, st: ReporterSettings, steps: dict[str, int] | None = None
                 ) -> tuple[int, int]:
    """(tasks_lag, ready) from the bus: the rollout group's lag on ``tasks``; the groups
    between rollout and the trainers (see the module docstring). A trainer commits its input
    only at checkpoints, so its backlog is the batches on ``batches.<policy>`` beyond its
    step (``steps``: each policy's trainer step, from its heartbeats), not its group lag."""
    run = st.run
    steps = steps or {}
    tasks = _lag(bus, st.rollout_group or group_name(run, "rollout"), topic_name(run, "tasks"))
    ready_trajectories = _lag(bus, group_name(run, "policy", stage="post_rollout"),
                              topic_name(run, "trajectories"))
    ready = ready_trajectories // max(1, st.group_size)
    for p in st.policies:
        ready += _lag(bus, group_name(run, "policy", stage="batch", policy=p),
                      topic_name(run, "groups", p))
        try:
            written = sum(bus.describe_topic(topic_name(run, "batches", p)).end_offsets.values())
        except BusError:
            written = 0
        ready += max(0, written - steps.get(p, 0)) * st.batch_groups.get(p, 1)
    return tasks, ready


def run_reporter(bus: Bus, settings: ReporterSettings, *, max_reports: int | None = None,
                 timeout: float | None = None, should_stop: Callable[[], bool] | None = None,
                 poll_timeout: float = 0.5, clock: Callable[[], float] = time.time
                 ) -> list[LoadReport]:
    """``astraflow report``: read ``metrics`` from its end, write a report when due, until
    ``max_reports`` reports, ``timeout`` seconds or ``should_stop()``. Returns the reports."""
    run = settings.run
    metrics_topic = topic_name(run, "metrics")
    reader = bus.reader(metrics_topic, start="latest", client_id=f"reporter-{run}")
    producer = bus.producer(client_id=f"reporter-{run}")
    emitter = MetricsEmitter(bus, run=run, role="reporter")
    reporter = Reporter(settings, seq=_next_seq(bus, run), window_start=clock())
    stop = Stop(max_reports, timeout, should_stop)
    sent: list[LoadReport] = []
    log.info("reporter run=%s every_steps=%d every_s=%s", run, settings.every_steps,
             settings.every_s)
    try:
        while not stop.reached(len(sent)):
            for msg in reader.consume(1000, stop.wait(poll_timeout)):
                try:
                    m = decode(msg.value, Metric)
                except SchemaError:
                    continue  # not ours to dead-letter: the reader joins no group
                if isinstance(m, Metric):
                    reporter.observe(m)
            now = clock()
            if reporter.due(now):
                tasks, ready = measure_lags(bus, settings, reporter.steps())
                rec = reporter.build(now, tasks_lag=tasks, ready=ready)
                send(producer, Output(topic_name(run, "reports"), rec,
                                      record_key("reports", rec)))
                producer.flush()
                sent.append(rec)
                emitter.inc("reports")
                emitter.set("wait_ratio", rec.wait_ratio)
                emitter.set("current_workers", rec.current_workers)
                emitter.set("useful_lag", rec.useful_lag)
                log.info("report seq=%d step=%d w=%.3f produced=%d consumed=%d workers=%d "
                         "tasks_lag=%d ready=%d useful_lag=%d", rec.seq, rec.trainer_step,
                         rec.wait_ratio, rec.produced, rec.consumed, rec.current_workers,
                         rec.tasks_lag, rec.ready, rec.useful_lag)
            emitter.tick()
    finally:
        reader.close()
        producer.close()
        emitter.close()
    return sent


def _next_seq(bus: Bus, run: str) -> int:
    """A restarted reporter numbers on from the reports already written (their count)."""
    try:
        return sum(bus.describe_topic(topic_name(run, "reports")).end_offsets.values())
    except BusError:
        return 0
