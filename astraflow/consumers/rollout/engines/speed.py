"""A slower engine on the same hardware: ``rollout.engine.speed`` runs any engine at a fraction
``s`` of its speed, standing in for a weaker GPU.

After a computation that took ``t`` seconds the engine sleeps another ``t * (1/s - 1)`` seconds,
holding no core. A computation is one batched :meth:`Engine.generate` call, one scheduler step
of an engine with a ``step_hook`` (the continuous ``hf``), or one request of an engine that
batches itself (``openai``; an approximation). :func:`slowed` wraps an engine. See
docs/rollout.md, "A slower engine".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from astraflow.consumers.rollout.engines.base import Engine, EngineError, GenRequest, GenResult

if TYPE_CHECKING:
    from astraflow.weights.target import WeightTarget

T = TypeVar("T")


def check_speed(speed: float, where: str = "rollout.engine.speed") -> float:
    """``speed`` as a float in (0, 1]; raises EngineError naming ``where`` otherwise."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed <= 1:
        raise EngineError(f"{where}: {speed!r} is not a speed in (0, 1] (1: full speed, "
                          "0.3: 30% of it)")
    return float(speed)


class Pacer:
    """The clock of a slowed engine: each computation of ``t`` seconds makes it owe
    ``t * (1/speed - 1)`` seconds of busy wait. Thread-safe; ``clock`` and ``sleep`` are
    injectable (tests drive it without real time)."""

    def __init__(self, speed: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.speed = check_speed(speed)
        self.factor = 1.0 / self.speed - 1.0
        self.clock = clock
        self.sleep = sleep
        self.computed_s = 0.0  # seconds the engine itself computed
        self.slowed_s = 0.0  # seconds it was held back asleep (the emulated slowness)
        self.computations = 0
        self._lock = threading.Lock()

    def owe(self, t: float) -> float:
        """Record a computation of ``t`` seconds; the seconds the engine now stays busy."""
        t = max(0.0, t)
        with self._lock:
            self.computed_s += t
            self.computations += 1
        return t * self.factor

    def hold(self, seconds: float) -> None:
        """Sleep ``seconds`` (when positive) and count them as slowed time."""
        if seconds <= 0:
            return
        self.sleep(seconds)
        with self._lock:
            self.slowed_s += seconds


class StepPacer:
    """The per-step hook of a continuous engine: at each step boundary (before the next step
    starts) it waits out what the previous step owes. Time with nothing in flight does not
    count as computation, and a wait that an idle period already covered is not taken again:
    the engine is busy until ``end + owed``, where ``end`` is when the previous step finished
    (or, if the engine went idle meanwhile, when its last request finished)."""

    def __init__(self, pacer: Pacer, previous: Callable[[int], None] | None = None) -> None:
        self.pacer = pacer
        self.previous = previous  # a hook that was there before (tests chain theirs)
        self._started: float | None = None  # when the running step began
        self._inflight = 0
        self._idle_at: float | None = None  # when the last request in flight finished
        self._lock = threading.Lock()

    def track(self, fut: Future[GenResult]) -> Future[GenResult]:
        """Count ``fut`` in flight until it resolves (how the pacer knows the engine idles)."""
        with self._lock:
            self._inflight += 1
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _: Future[GenResult]) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle_at = self.pacer.clock()

    def __call__(self, iteration: int) -> None:
        if self.previous is not None:
            self.previous(iteration)
        pacer = self.pacer
        now = pacer.clock()
        if self._started is not None:
            with self._lock:
                idle_at = self._idle_at
            end = idle_at if idle_at is not None and idle_at >= self._started else now
            pacer.hold(end + pacer.owe(end - self._started) - now)
        self._started = pacer.clock()


class SlowedEngine:
    """An :class:`~.base.Engine` running ``inner`` at ``speed`` (see the module docstring)."""

    def __init__(self, inner: Engine, speed: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner = inner
        self.pacer = Pacer(speed, clock=clock, sleep=sleep)
        self.name = inner.name
        self.tokenizer = inner.tokenizer
        self.max_batch_size = inner.max_batch_size
        self.continuous = bool(getattr(inner, "continuous", False))
        self._serial = threading.Lock()  # a batched engine's next batch waits for the last
        self.steps: StepPacer | None = None
        if self.continuous and hasattr(inner, "step_hook"):
            self.steps = StepPacer(self.pacer, getattr(inner, "step_hook", None))
            inner.step_hook = self.steps
        self._queues = self.continuous and callable(getattr(inner, "submit", None))
        if self._queues:
            self.submit = self._submit  # the batcher awaits these futures directly

    @property
    def speed(self) -> float:
        return self.pacer.speed

    @property
    def slowed_s(self) -> float:
        """Seconds this engine was held back asleep so far (``engine.slowed_s`` metric)."""
        return self.pacer.slowed_s

    @property
    def version(self) -> int:
        return self.inner.version

    def __getattr__(self, name: str) -> Any:  # the wrapped engine's own attributes
        if name == "inner":  # not set yet (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _submit(self, request: GenRequest) -> Future[GenResult]:
        fut: Future[GenResult] = self.inner.submit(request)  # type: ignore[attr-defined]
        return self.steps.track(fut) if self.steps is not None else fut

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        if self.steps is not None:  # paced per step in the decode thread
            if self._queues:
                return [f.result() for f in [self._submit(r) for r in requests]]
            return self.inner.generate(requests)
        pacer = self.pacer
        if self.continuous:  # requests run side by side: each comes back 1/s as late
            t0 = pacer.clock()
            results = self.inner.generate(requests)
            pacer.hold(pacer.owe(pacer.clock() - t0))
            return results
        with self._serial:
            t0 = pacer.clock()
            try:
                return self.inner.generate(requests)
            finally:
                pacer.hold(pacer.owe(pacer.clock() - t0))

    def weight_target(self) -> WeightTarget | None:
        return self.inner.weight_target()

    def update_weights(self, fn: Callable[[], T]) -> T:
        return self.inner.update_weights(fn)

    def close(self) -> None:
        self.inner.close()


def slowed(engine: Engine, speed: float) -> Engine:
    """``engine`` at ``speed`` in (0, 1]: itself at 1.0, else a :class:`SlowedEngine`."""
    return engine if check_speed(speed) == 1.0 else SlowedEngine(engine, speed)
