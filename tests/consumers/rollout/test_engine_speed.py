"""``rollout.engine.speed`` (astraflow.consumers.rollout.engines.speed): the config refuses
speeds outside (0, 1]; the pacer's arithmetic on a fake clock (batched, per step with idle
time, per request); a real batched hf engine at a third of its speed sleeps twice each batch's
computation before the next batch (counted exactly on the pacer's clock: one second per
forward pass); a real continuous one waits out each decoding step's due at the next boundary;
the worker wraps its engines, reports the time slowed, and at 30% keeps its engine busy 1/0.3
as long as it computes. Nothing here measures the wall clock: the ratios (busy time, CPU time,
episodes/s against a full-speed arm) are in bench/engine_speed.py."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import make_task, produce, read_all

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.engines import GenRequest, GenResult, build_engine
from astraflow.consumers.rollout.engines.base import Engine, EngineError
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.consumers.rollout.engines.speed import (
    Pacer,
    SlowedEngine,
    StepPacer,
    slowed,
)
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.core.records import Metric
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker

WAIT = 60.0  # seconds any future of these tests may take before the test fails


# -- config ------------------------------------------------------------------------------------

def test_speed_defaults_to_full_and_refuses_values_outside_zero_one() -> None:
    assert ExperimentConfig().rollout.engine.speed == 1.0
    ok = validate(ExperimentConfig, {"rollout": {"engine": {"speed": 0.3}}})
    assert ok.rollout.engine.speed == 0.3
    for bad in (0, -0.5, 1.5, float("nan"), float("inf"), "fast"):
        with pytest.raises(ConfigError, match=r"rollout\.engine\.speed"):
            validate(ExperimentConfig, {"rollout": {"engine": {"speed": bad}}})
    with pytest.raises(ConfigError) as e:  # reported with the section's other problems
        validate(ExperimentConfig, {"rollout": {"engine": {"speed": 2, "top_p": 0}}})
    assert len(e.value.problems) == 2


def test_slowed_is_the_engine_itself_at_full_speed_and_refuses_bad_speeds() -> None:
    inner = FakeEngine(FakeClock(), compute=1.0)
    assert slowed(inner, 1.0) is inner
    assert isinstance(slowed(inner, 0.5), SlowedEngine)
    for bad in (0, 1.01, -1, True):
        with pytest.raises(EngineError, match=r"rollout.engine.speed"):
            slowed(inner, bad)


# -- the pacer's arithmetic on a fake clock ---------------------------------------------------

class FakeClock:
    """Time that moves only when told to; ``sleep`` moves it and is recorded."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakeEngine:
    """A batched (or, with ``continuous``, self-batching) engine whose every generate call
    takes ``compute`` seconds of the fake clock."""

    name = "fake"
    tokenizer = None
    max_batch_size = 4
    version = 7

    def __init__(self, clock: FakeClock, compute: float, *, continuous: bool = False,
                 fail: bool = False) -> None:
        self.clock, self.compute, self.continuous, self.fail = clock, compute, continuous, fail
        self.calls = 0
        self.closed = False

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        self.calls += 1
        self.clock.now += self.compute
        if self.fail:
            raise EngineError("boom")
        return [GenResult([1], [-0.1], [self.version], "stop") for _ in requests]

    def weight_target(self) -> None:
        return None

    def update_weights(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def close(self) -> None:
        self.closed = True


def fake_slowed(inner: FakeEngine, speed: float) -> SlowedEngine:
    return SlowedEngine(inner, speed, clock=inner.clock, sleep=inner.clock.sleep)


def test_a_batched_engine_stays_busy_t_times_one_over_s_minus_one_after_each_batch() -> None:
    clock = FakeClock()
    inner = FakeEngine(clock, compute=2.0)
    engine = fake_slowed(inner, 0.25)
    assert isinstance(engine, Engine)  # the wrapper is an engine of the protocol
    req = [GenRequest([1, 2])]
    assert engine.generate(req)[0].token_ids == [1]
    assert clock.slept == [pytest.approx(6.0)] and clock.now == pytest.approx(8.0)  # 2 / 0.25
    inner.compute = 0.5
    engine.generate(req * 3)
    assert clock.slept[-1] == pytest.approx(1.5)
    assert engine.pacer.computed_s == pytest.approx(2.5)
    assert engine.slowed_s == pytest.approx(7.5) and engine.pacer.computations == 2
    inner.fail = True  # a failed batch also took the engine's time
    with pytest.raises(EngineError, match="boom"):
        engine.generate(req)
    assert clock.slept[-1] == pytest.approx(1.5)
    # everything else is the wrapped engine's
    assert (engine.name, engine.version, engine.max_batch_size, engine.speed) == (
        "fake", 7, 4, 0.25)
    assert engine.calls == 3 and engine.update_weights(lambda: 5) == 5
    engine.close()
    assert inner.closed


def test_a_batched_engine_starts_no_batch_before_the_last_ones_wait_is_over() -> None:
    events: list[str] = []
    release = threading.Event()

    def sleep(_: float) -> None:
        events.append("wait")
        release.wait(WAIT)
        events.append("waited")

    class Recorder(FakeEngine):
        def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
            events.append("compute")
            return super().generate(requests)

    clock = FakeClock()
    engine = SlowedEngine(Recorder(clock, compute=1.0), 0.5, clock=clock, sleep=sleep)
    first = threading.Thread(target=engine.generate, args=([GenRequest([1])],))
    first.start()
    deadline = time.monotonic() + WAIT
    while events != ["compute", "wait"] and time.monotonic() < deadline:
        time.sleep(0.001)
    second = threading.Thread(target=engine.generate, args=([GenRequest([1])],))
    second.start()
    second.join(0.2)  # it must be blocked while the first batch's wait runs
    assert events == ["compute", "wait"]
    release.set()
    first.join(WAIT)
    second.join(WAIT)
    assert events == ["compute", "wait", "waited", "compute", "wait", "waited"]


def test_a_self_batching_engine_without_steps_slows_each_request_by_its_own_time() -> None:
    clock = FakeClock()
    engine = fake_slowed(FakeEngine(clock, compute=3.0, continuous=True), 0.6)
    assert engine.continuous and getattr(engine, "submit", None) is None
    engine.generate([GenRequest([1])])
    assert clock.slept == [pytest.approx(3.0 * (1 / 0.6 - 1))]


def test_the_step_pacer_waits_out_each_step_and_counts_idle_time_as_served() -> None:
    clock = FakeClock()
    pacer = Pacer(0.5, clock=clock, sleep=clock.sleep)
    seen: list[int] = []
    steps = StepPacer(pacer, previous=seen.append)
    fut: Future[GenResult] = Future()
    steps.track(fut)
    steps(1)  # the first step: nothing owed yet
    assert clock.slept == []
    clock.now += 1.0  # step 1 computes for 1 s
    steps(2)
    assert clock.slept == [pytest.approx(1.0)]  # 1 s more at half speed
    clock.now += 2.0  # step 2: 2 s, and its last request finishes with it
    fut.set_result(GenResult([], [], [], "stop"))
    clock.now += 10.0  # idle for 10 s: the 2 s owed were served meanwhile
    newcomer: Future[GenResult] = Future()
    steps.track(newcomer)
    steps(3)
    assert clock.slept == [pytest.approx(1.0)]
    clock.now += 1.0  # step 3: 1 s; then the engine idles only 0.25 s before the next step
    newcomer.set_result(GenResult([], [], [], "stop"))
    clock.now += 0.25
    steps.track(Future())
    steps(4)
    assert clock.slept[-1] == pytest.approx(0.75)
    assert seen == [1, 2, 3, 4]  # a hook that was there before still runs
    assert pacer.computed_s == pytest.approx(1.0 + 2.0 + 1.0)


# -- a real engine, its computation counted on the pacer's clock ------------------------------

def arith_requests(engine: Any, n: int = 8, tokens: int = 24) -> list[GenRequest]:
    tok = engine.tokenizer
    return [GenRequest(tok(f"{i}+{2 * i}=")["input_ids"], max_new_tokens=tokens,
                       temperature=0.0) for i in range(n)]


def counted(engine: HFEngine, clock: FakeClock, events: list[float | None]) -> None:
    """Make ``engine``'s every forward pass take one second of ``clock`` (recorded in
    ``events`` as None); the real pass still runs."""
    real_forward = engine._forward

    def forward(*args: Any) -> Any:
        events.append(None)
        clock.now += 1.0
        return real_forward(*args)

    engine._forward = forward  # type: ignore[method-assign]


def batches(events: list[float | None]) -> list[tuple[int, float]]:
    """(forward passes, the sleep after them) per batch of ``events``; fails on forward passes
    that no sleep followed."""
    out, passes = [], 0
    for e in events:
        if e is None:
            passes += 1
        else:
            out.append((passes, e))
            passes = 0
    assert passes == 0, f"{passes} forward passes were not followed by a wait"
    return out


# A third of the speed: every computation is followed by twice its own time asleep.
SPEED = 1 / 3


def test_a_third_speed_hf_engine_sleeps_twice_each_batchs_compute_before_the_next(
        arith_dir: Path) -> None:
    """The real batched engine, its computation made exact: each forward pass advances the
    pacer's clock by one second, and the pacer's sleeps are recorded. Each ``generate`` call
    is followed, before it returns and before the next batch's first pass, by one sleep of
    (1/s - 1) times the passes it made, so the engine is busy 1/s as long on the same
    computation; the wait is a sleep (the default one is ``time.sleep``: no core is held);
    the tokens are the unslowed engine's. (This compared wall-clock and CPU-time ratios,
    which depend on the machine's load: they are measured in bench/engine_speed.py.)"""
    hf: HFEngine = build_engine("hf", model_path=arith_dir, threads=1,  # type: ignore[assignment]
                                seed=1)
    assert slowed(hf, SPEED).pacer.sleep is time.sleep  # type: ignore[attr-defined]
    clock = FakeClock()
    events: list[float | None] = []
    counted(hf, clock, events)

    def sleep(seconds: float) -> None:
        events.append(seconds)
        clock.sleep(seconds)

    slow = SlowedEngine(hf, SPEED, clock=clock, sleep=sleep)
    try:
        reqs = arith_requests(hf)
        expected = [r.token_ids for r in hf.generate(reqs)]
        plain_passes = len(events)
        assert plain_passes > 2 and clock.slept == []  # unslowed: no wait at all
        events.clear()
        clock.now = 0.0
        for n in (8, 3, 8):
            assert [r.token_ids for r in slow.generate(reqs[:n])] == expected[:n]
        done = batches(events)
        assert len(done) == 3 == slow.pacer.computations
        assert done[0][0] == done[2][0] == plain_passes  # the same work as unslowed
        assert [w for _, w in done] == [pytest.approx(2 * p) for p, _ in done]
        computed = sum(p for p, _ in done)
        assert slow.pacer.computed_s == pytest.approx(computed)
        assert slow.slowed_s == pytest.approx(2 * computed)
        assert clock.now == pytest.approx(computed / SPEED)  # busy 3x as long
    finally:
        slow.close()


def test_a_continuous_hf_engine_is_slowed_per_decoding_step(arith_dir: Path) -> None:
    """The real continuous engine, its computation made exact: each forward pass advances the
    pacer's clock by one second, and the pacer's sleeps are recorded. At every step boundary
    but a busy period's first, the decode thread waits, before the next step's forward pass,
    (1/s - 1) times what the step before computed; a wait that an idle gap already covered is
    not taken; the tokens are the unslowed engine's. (This compared CPU-time ratios, which
    flaked on loaded machines: 1.47 against a bound of 1.4.)"""
    def continuous() -> HFEngine:
        return build_engine("hf", model_path=arith_dir, threads=1,  # type: ignore[return-value]
                            seed=1, continuous=True)

    plain, inner = continuous(), continuous()
    clock = FakeClock()
    forwards = 0
    runs: list[list[int]] = []  # per run: the forward passes done at each of its step boundaries
    gaps: list[float] = []  # idle seconds that pass before the next run's first step
    waits: list[tuple[int, float, str]] = []  # (forward passes done, seconds, thread) per wait
    real_forward = inner._forward

    def forward(*args: Any) -> Any:
        nonlocal forwards
        forwards += 1
        clock.now += 1.0
        return real_forward(*args)

    def boundary(_: int) -> None:  # the decode thread, before the pacer's turn
        if not runs[-1] and gaps:
            clock.now += gaps.pop()
        runs[-1].append(forwards)

    def sleep(seconds: float) -> None:
        waits.append((forwards, seconds, threading.current_thread().name))
        clock.sleep(seconds)

    inner._forward = forward  # type: ignore[method-assign]
    inner.step_hook = boundary
    slow = SlowedEngine(inner, SPEED, clock=clock, sleep=sleep)
    try:
        reqs = arith_requests(plain)

        def run(engine: Any) -> list[list[int]]:
            futs = [engine.submit(r) for r in reqs]
            return [f.result(WAIT).token_ids for f in futs]

        expected = run(plain)
        runs.append([])
        assert run(slow) == expected
        runs.append([])
        gaps.append(1e6)  # idle far longer than the last step owes
        assert run(slow) == expected
        factor = 1 / SPEED - 1
        assert waits == [(b, pytest.approx(factor * (b - a)), "af-decode-hf")
                         for r in runs for a, b in itertools.pairwise(r)]
        assert all(len(r) > 2 for r in runs)  # several decoding steps per run
        assert slow.pacer.computations == inner.decoder.iterations - 1  # one per step
        assert slow.slowed_s == pytest.approx(sum(w for _, w, _ in waits))
        assert slow.generate(reqs[:2])[0].token_ids == expected[0]
    finally:
        plain.close()
        slow.close()


# -- the worker --------------------------------------------------------------------------------

def test_the_worker_runs_its_engines_at_the_configured_speed_and_reports_it(
        tmp_path: Path, arith_dir: Path) -> None:
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "rollout": {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 4,
                               "speed": 0.4},
                    "weights": {"enabled": False}, "metrics_interval": 0.2,
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus = open_bus(cfg, tmp_path)
    try:
        produce(bus, cfg.run, [make_task(i, n=2) for i in range(4)])
        worker = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-slow")
        engine = worker.runtime.engines["default"]
        assert isinstance(engine, SlowedEngine) and engine.speed == 0.4
        assert worker.runtime.batcher("default").engine is engine
        stats = worker.run(max_tasks=4)
        assert stats.episodes == 8
        metrics = [m for m in read_all(bus, topic_name(cfg.run, "metrics"), Metric)
                   if m.component == "w-slow"]
        last = metrics[-1]
        assert last.gauges["engine.speed"] == 0.4
        assert engine.slowed_s > 0
        assert last.counters["engine.slowed_s"] == pytest.approx(engine.slowed_s)
        assert engine.slowed_s == pytest.approx(engine.pacer.computed_s * (1 / 0.4 - 1))

        full = configured_worker(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
            update={"engine": cfg.rollout.engine.model_copy(update={"speed": 1.0})})}),
            tmp_path, bus=bus, worker_id="w-full")
        assert isinstance(full.runtime.engines["default"], HFEngine)  # no wrapper at 1.0
        full.runtime.engines["default"].close()
    finally:
        bus.close()


def test_a_worker_at_30_percent_keeps_its_engine_busy_1_over_0_3_of_its_compute(
        tmp_path: Path, arith_dir: Path) -> None:
    """The worker as a whole (its own Python is not slowed), its engine's computation made
    exact (one second of the pacer's clock per forward pass, the sleeps recorded): every batch
    the worker sends is followed by (1/0.3 - 1) times its passes asleep before the next one
    starts, so on the engine's clock the worker makes 30% of the episodes per second it would
    make at full speed; every episode is made. (This measured episodes/s and CPU-time ratios
    against a full-speed worker, which depend on the machine's load: they are measured in
    bench/engine_speed.py.)"""
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "rollout": {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 8,
                               "speed": 0.3, "max_batch_size": 8},
                    "weights": {"enabled": False}, "max_concurrent_episodes": 32,
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus = open_bus(cfg, tmp_path)
    try:
        produce(bus, cfg.run, [make_task(k, n=8) for k in range(8)])
        worker = configured_worker(cfg, tmp_path, bus=bus)
        engine = worker.runtime.engines["default"]
        assert isinstance(engine, SlowedEngine) and isinstance(engine.inner, HFEngine)
        clock = FakeClock()
        events: list[float | None] = []
        counted(engine.inner, clock, events)

        def sleep(seconds: float) -> None:
            events.append(seconds)
            clock.sleep(seconds)

        engine.pacer.clock, engine.pacer.sleep = clock, sleep
        stats = worker.run(max_tasks=8)
    finally:
        bus.close()
    assert stats.episodes == 64 and stats.episodes_failed == 0
    done = batches(events)
    assert len(done) == engine.pacer.computations >= 64 // 8  # one wait per batch
    factor = 1 / 0.3 - 1
    assert [w for _, w in done] == [pytest.approx(factor * p) for p, _ in done]
    assert engine.pacer.computed_s == pytest.approx(sum(p for p, _ in done))
    assert clock.now == pytest.approx(engine.pacer.computed_s / 0.3)
