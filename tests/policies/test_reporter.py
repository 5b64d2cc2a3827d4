"""The reporter: its window arithmetic on known heartbeats, and on a real bus (each backend)
the reports it writes from processes' real metrics emitters and the run's group lags."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from astraflow.core.bus import Bus, connect
from astraflow.core.metrics import MetricsEmitter, component_id
from astraflow.core.records import LoadReport, Metric, decode
from astraflow.core.topics import run_topics, topic_name
from astraflow.policies.reporter import Reporter, ReporterSettings, measure_lags, run_reporter


def settings(**kw: object) -> ReporterSettings:
    base: dict[str, object] = dict(run="r", policies=["default"], batch_groups={"default": 8},
                                   max_staleness={"default": 2}, group_size=4, every_steps=10,
                                   every_s=None, heartbeat_timeout_s=15.0)
    return ReporterSettings(**{**base, **kw})  # type: ignore[arg-type]


def metric(component: str, role: str, ts: float, status: str = "running",
           **counters: float) -> Metric:
    gauges = {"step": counters.pop("step")} if "step" in counters else {}
    return Metric(component=component, role=role, host="h", pid=1, ts=ts,
                  status=status, counters=counters, gauges=gauges)  # type: ignore[arg-type]


def test_window_wait_ratio_produced_consumed_and_workers() -> None:
    rep = Reporter(settings(), window_start=100.0)
    trainer = "trainer-default-h-1-abcd"
    rep.observe(metric(trainer, "trainer", 100.0, wait_s=50.0, busy_s=50.0, trajectories=80,
                       steps=5, step=5))
    rep.observe(metric("rollout-a", "rollout", 100.0, episodes=0))
    rep.observe(metric("rollout-b", "rollout", 90.0, episodes=0))
    assert not rep.due(105.0)
    # the window: the trainer waited 3 s and worked 7 s, trained 40 trajectories in 10 steps
    rep.observe(metric(trainer, "trainer", 110.0, wait_s=53.0, busy_s=57.0, trajectories=120,
                       steps=15, step=15))
    rep.observe(metric("rollout-a", "rollout", 110.0, episodes=20,
                       **{"trajectories.default": 20}))
    rep.observe(metric("rollout-b", "rollout", 95.0, episodes=10,  # silent since 95
                       **{"trajectories.default": 12}))
    assert rep.due(110.0)  # 10 steps since the last report
    r = rep.build(111.0, tasks_lag=50, ready=10)
    assert r.wait_ratio == pytest.approx(0.3)
    assert (r.produced, r.consumed, r.trainer_step) == (32, 40, 15)
    (p,) = r.policies
    assert (p.policy, p.steps, p.wait_ratio) == ("default", 10, pytest.approx(0.3))
    a, b = r.workers
    assert (a.component, a.healthy, a.episodes_per_s) == ("rollout-a", True, 2.0)
    assert b.healthy is False  # 16 s since its heartbeat > 15 s
    assert r.current_workers == 1
    assert (r.horizon, r.ready, r.tasks_lag) == (24, 10, 50)  # (2+1)*8
    assert r.useful_lag == 14  # min(50, 24 - 10)
    assert r.seq == 0
    # the next window starts where this one ended
    assert not rep.due(112.0)
    r2 = rep.build(120.0, tasks_lag=3, ready=30)
    assert (r2.seq, r2.produced, r2.consumed, r2.useful_lag) == (1, 0, 0, 0)
    assert r2.wait_ratio == 0.0  # no trainer time in the window: 0, not a division by zero


def test_draining_and_stopped_workers_are_listed_not_counted() -> None:
    rep = Reporter(settings(heartbeat_timeout_s=100.0), window_start=0.0)
    rep.observe(metric("rollout-a", "rollout", 1.0))
    rep.observe(metric("rollout-b", "rollout", 1.0, status="draining"))
    rep.observe(metric("rollout-c", "rollout", 1.0, status="stopped"))
    r = rep.build(2.0, tasks_lag=0, ready=0)
    assert [(w.component, w.status, w.healthy) for w in r.workers] == [
        ("rollout-a", "running", True), ("rollout-b", "draining", True),
        ("rollout-c", "stopped", False)]
    assert r.current_workers == 1
    # long gone: dropped from later reports
    assert [w.component for w in rep.build(1000.0, tasks_lag=0, ready=0).workers] == [
        "rollout-a", "rollout-b"]


def test_per_policy_loads_in_a_two_policy_run() -> None:
    rep = Reporter(settings(policies=["solver", "verifier"],
                            batch_groups={"solver": 8, "verifier": 4},
                            max_staleness={"solver": 1, "verifier": 3}), window_start=0.0)
    rep.observe(metric("trainer-solver-h-1-aaaa", "trainer", 0.0, wait_s=0, busy_s=0))
    rep.observe(metric("trainer-verifier-h-1-bbbb", "trainer", 0.0, wait_s=0, busy_s=0))
    rep.observe(metric("rollout-a", "rollout", 0.0))
    rep.observe(metric("trainer-solver-h-1-aaaa", "trainer", 9.0, wait_s=1, busy_s=9,
                       trajectories=16, step=2))
    rep.observe(metric("trainer-verifier-h-1-bbbb", "trainer", 9.0, wait_s=6, busy_s=4,
                       trajectories=8, step=1))
    rep.observe(metric("rollout-a", "rollout", 9.0, **{"trajectories.solver": 20,
                                                       "trajectories.verifier": 10}))
    r = rep.build(10.0, tasks_lag=0, ready=0)
    loads = {p.policy: p for p in r.policies}
    assert loads["solver"].wait_ratio == pytest.approx(0.1)
    assert loads["verifier"].wait_ratio == pytest.approx(0.6)
    assert (loads["solver"].produced, loads["verifier"].consumed) == (20, 8)
    assert r.wait_ratio == pytest.approx(0.6)  # the largest
    assert r.horizon == 2 * 8 + 4 * 4
    assert r.trainer_step == 2


def test_a_time_window_reports_a_starved_trainer_that_makes_no_steps() -> None:
    rep = Reporter(settings(every_s=30.0), window_start=0.0)
    rep.observe(metric("trainer-default-h-1-abcd", "trainer", 0.0, step=0))
    assert not rep.due(29.0)
    assert rep.due(30.0)


@pytest.fixture
def bus(bus_url: str) -> Iterator[Bus]:
    b = connect(bus_url)
    yield b
    b.close()


def test_reports_on_the_bus_from_real_emitters(bus: Bus) -> None:
    run = f"rep-{uuid.uuid4().hex[:8]}"
    bus.create_topics(run_topics(run, ["default"]))
    # windows of a second or more: several heartbeats of both (Kafka delivers the two
    # components, on different partitions, in no set order)
    st = settings(run=run, every_steps=2, every_s=None, min_window_s=1.0)
    # released tasks nobody consumed yet: the rollout group's lag
    prod = bus.producer()
    for i in range(5):
        prod.produce(topic_name(run, "tasks"), b"x", key=f"t{i}".encode())
    prod.flush()
    prod.close()
    assert measure_lags(bus, st) == (5, 0)

    trainer = MetricsEmitter(bus, run=run, role="trainer",
                             component=component_id("trainer-default"), interval=0.0)
    worker = MetricsEmitter(bus, run=run, role="rollout", interval=0.0)
    stop_after: list[int] = []

    def feed() -> bool:
        # one more heartbeat of each per reporter poll: 1 step, 1 s waited, 3 s busy
        n = len(stop_after)
        stop_after.append(n)
        trainer.inc("wait_s", 1.0)
        trainer.inc("busy_s", 3.0)
        trainer.inc("trajectories", 4)
        trainer.inc("steps")
        trainer.set("step", n + 1)
        trainer.emit()
        worker.inc("trajectories.default", 5)
        worker.inc("episodes", 5)
        worker.emit()
        return False

    sent = run_reporter(bus, st, max_reports=2, timeout=60.0, should_stop=feed,
                        poll_timeout=0.2)
    assert len(sent) == 2
    reader = bus.reader(topic_name(run, "reports"))
    on_bus = [decode(m.value, LoadReport) for m in reader.consume(10, 5.0)]
    reader.close()
    assert [r.seq for r in on_bus] == [0, 1]  # type: ignore[union-attr]
    for r in on_bus:
        assert isinstance(r, LoadReport)
        assert r.wait_ratio == pytest.approx(0.25)
        assert r.tasks_lag == 5 and r.horizon == 24 and r.useful_lag == 5
        assert r.consumed > 0 and r.produced > 0 and r.current_workers == 1
    trainer.close()
    worker.close()


def test_utilization_is_the_mean_busy_share_of_running_workers_slots() -> None:
    rep = Reporter(settings(), window_start=0.0)

    def beat(c: str, ts: float, inflight: float, status: str = "running") -> None:
        rep.observe(Metric(component=c, role="rollout", host="h", pid=1, ts=ts,
                           status=status,  # type: ignore[arg-type]
                           gauges={"inflight": inflight, "max_inflight": 16}))

    beat("rollout-a", 1.0, 16)
    beat("rollout-a", 3.0, 8)   # a: 0.75 over its beats
    beat("rollout-b", 1.0, 4)
    beat("rollout-b", 3.0, 0)   # b: 0.125
    beat("rollout-c", 3.0, 16, status="draining")  # leaving: not counted
    r = rep.build(4.0, tasks_lag=0, ready=0)
    by = {w.component: w.utilization for w in r.workers}
    assert by["rollout-a"] == pytest.approx(0.75) and by["rollout-b"] == pytest.approx(0.125)
    assert by["rollout-c"] == -1.0
    assert r.utilization == pytest.approx((0.75 + 0.125) / 2)
    # a new window starts from no samples
    assert rep.build(5.0, tasks_lag=0, ready=0).utilization == -1.0
