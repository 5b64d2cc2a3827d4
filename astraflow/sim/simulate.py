"""A discrete-event simulation of rollout feeding a trainer, on the event clock of
:mod:`astraflow.sim.events`.

One continuously batching engine (a step lasts ``step_a + step_b * batch`` seconds) feeds a
trainer that takes ``train_s`` per step plus ``sync_s`` to publish. At policy version ``v`` at
most ``(v + staleness + 1) * batch_groups`` groups may have been launched; ``staleness`` 0 is
synchronous training. The model is described in docs/replay.md."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from astraflow.sim.errors import ReplayError
from astraflow.sim.events import Events
from astraflow.sim.workload import Episode, Workload, quantile

TAIL_FRACTION = 0.1


@dataclass(frozen=True)
class SimConfig:
    """The simulated hardware and schedule (see the module docstring)."""

    step_a: float = 0.015  # seconds per decoding step, fixed part
    step_b: float = 5e-5  # seconds per decoding step, per episode in the batch
    concurrency: int = 256  # episodes in flight at most; 0: no limit
    train_s: float = 1.0
    sync_s: float = 0.0
    batch_groups: int = 8
    staleness: int = 1
    steps: int | None = None  # None: as many whole steps as the workload has groups

    def check(self) -> None:
        problems = [f"{k}={getattr(self, k)!r} must be >= 0"
                    for k in ("step_a", "step_b", "concurrency", "train_s", "sync_s",
                              "staleness") if getattr(self, k) < 0]
        if self.step_a + self.step_b <= 0:
            problems.append("step_a + step_b must be > 0 (a decoding step takes time)")
        if self.batch_groups < 1:
            problems.append(f"batch_groups={self.batch_groups} must be >= 1")
        if self.steps is not None and self.steps < 1:
            problems.append(f"steps={self.steps} must be >= 1")
        if problems:
            raise ReplayError("bad replay settings: " + "; ".join(problems))


@dataclass
class Result:
    """What one schedule did. ``episodes``: (start, end) seconds of every trained episode,
    start being when it got its in-flight slot (queueing for a slot is not its time)."""

    schedule: str
    staleness: int
    wall_s: float
    steps: int
    samples: int
    trainer_busy_s: float
    engine_busy_s: float
    episodes: list[tuple[float, float]] = field(default_factory=list)
    staleness_seen: list[int] = field(default_factory=list)

    @property
    def trainer_wait_ratio(self) -> float:
        """Fraction of the wall time the trainer is neither training nor publishing weights."""
        return 1.0 - self.trainer_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Trained trajectories per second of wall time."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def engine_busy_ratio(self) -> float:
        return self.engine_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tail_share(self) -> float:
        """The share of the summed episode time taken by the slowest 10% of episodes: sort the
        trained episodes' durations (end - start) in decreasing order, take the first
        ``ceil(0.1 * n)``, and divide their sum by the sum of all ``n``. Equal episodes give
        ``ceil(0.1 n) / n`` (0.1 when 10 divides n); 1.0 means the tail is all the time."""
        return tail_share([end - start for start, end in self.episodes])

    def latency(self, q: float) -> float:
        """The ``q`` quantile (nearest rank) of the trained episodes' durations."""
        return quantile([end - start for start, end in self.episodes], q)

    @property
    def staleness_mean(self) -> float:
        s = self.staleness_seen
        return sum(s) / len(s) if s else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness_seen, default=0)

    def summary(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule, "staleness": self.staleness, "wall_s": self.wall_s,
            "steps": self.steps, "samples": self.samples,
            "trainer_wait_ratio": self.trainer_wait_ratio, "samples_per_s": self.samples_per_s,
            "tail_share": self.tail_share, "engine_busy_ratio": self.engine_busy_ratio,
            "episode_p50_s": self.latency(0.5), "episode_p99_s": self.latency(0.99),
            "staleness_mean": self.staleness_mean, "staleness_max": self.staleness_max,
        }


def tail_share(durations: list[float], fraction: float = TAIL_FRACTION) -> float:
    """See :attr:`Result.tail_share`; 0.0 for no episodes or no time."""
    total = sum(durations)
    if not durations or total <= 0:
        return 0.0
    n = math.ceil(fraction * len(durations))
    return sum(sorted(durations, reverse=True)[:n]) / total


class _Ep:
    __slots__ = ("end", "episode", "group", "seg", "start")

    def __init__(self, episode: Episode, group: int) -> None:
        self.episode = episode
        self.group = group
        self.seg = 0
        self.start = self.end = 0.0


class _Sim:
    """One run of the model in the module docstring; :func:`simulate` drives it."""

    def __init__(self, workload: Workload, cfg: SimConfig, staleness: int, steps: int) -> None:
        self.cfg = cfg
        self.k = staleness
        self.steps = steps
        groups = workload.groups
        self.groups = [groups[i % len(groups)] for i in range(steps * cfg.batch_groups)]
        self.clock = Events()
        self._seq = 0  # ties of the decoding heap: first joined, first out
        # engine: every decoding episode finishes its turn when ``decoded`` reaches its target
        self.decoded = 0
        self.decoding: list[tuple[int, int, _Ep]] = []
        self.joining: list[tuple[_Ep, int]] = []
        self.busy = False
        self.chunk = (0.0, 0.0, 0)  # (start, seconds per step, steps)
        self.gen = 0
        self.engine_busy_s = 0.0
        # rollout
        self.in_flight = 0
        self.queue: deque[_Ep] = deque()
        self.launched = 0
        self.launch_version: list[int] = []
        self.left: list[int] = []
        self.eps: list[list[_Ep]] = []
        # trainer
        self.version = 0
        self.ready: deque[int] = deque()
        self.training = False
        self.trainer_busy_s = 0.0
        self.trained: list[int] = []
        self.staleness_seen: list[int] = []

    @property
    def t(self) -> float:
        return self.clock.now

    def done(self) -> bool:
        return len(self.trained) == self.steps * self.cfg.batch_groups

    def run(self) -> float:
        self.launch()
        self.kick()
        # the engine starts its next run of steps once every event of an instant has fired
        if self.clock.run(stop=self.done, settle=self.kick):
            return self.t
        raise ReplayError("the simulation ran out of events before the last step "  # pragma: no cover
                          f"({len(self.trained) // self.cfg.batch_groups} of {self.steps})")

    # -- rollout ---------------------------------------------------------------------------

    def launch(self) -> None:
        cap = min(len(self.groups), (self.version + self.k + 1) * self.cfg.batch_groups)
        while self.launched < cap:
            g = self.launched
            self.launched += 1
            self.launch_version.append(self.version)
            eps = [_Ep(e, g) for e in self.groups[g].episodes]
            self.eps.append(eps)
            self.left.append(len(eps))
            if not eps:
                self.group_done(g)
            for ep in eps:
                self.admit(ep)

    def admit(self, ep: _Ep) -> None:
        if self.cfg.concurrency and self.in_flight >= self.cfg.concurrency:
            self.queue.append(ep)
            return
        self.in_flight += 1
        ep.start = self.t
        self.begin(ep)

    def begin(self, ep: _Ep) -> None:
        if ep.seg >= len(ep.episode.segments):
            self.finish(ep)
            return
        tokens = ep.episode.segments[ep.seg].tokens
        if tokens > 0:
            self.join(ep, tokens)
        else:
            self.end_turn(ep)

    def end_turn(self, ep: _Ep) -> None:
        wait = ep.episode.segments[ep.seg].wait
        if wait > 0:
            self.clock.after(wait, self.after_wait, ep)
        else:
            self.after_wait(ep)

    def after_wait(self, ep: _Ep) -> None:
        ep.seg += 1
        self.begin(ep)

    def finish(self, ep: _Ep) -> None:
        ep.end = self.t
        self.in_flight -= 1
        while self.queue and (not self.cfg.concurrency or self.in_flight < self.cfg.concurrency):
            self.admit(self.queue.popleft())
        self.left[ep.group] -= 1
        if self.left[ep.group] == 0:
            self.group_done(ep.group)

    # -- engine ----------------------------------------------------------------------------

    def join(self, ep: _Ep, tokens: int) -> None:
        self.joining.append((ep, tokens))
        if self.busy:  # cut the running chunk at the next step boundary, where ep joins
            start, step, steps = self.chunk
            j = max(1, math.ceil((self.t - start) / step - 1e-9))
            if j < steps:
                self.gen += 1
                self.chunk = (start, step, j)
                self.clock.at(start + j * step, self.on_engine, self.gen)

    def kick(self) -> None:
        """Start the next run of steps (up to the first turn to finish) if idle."""
        if self.busy:
            return
        for ep, tokens in self.joining:
            self._seq += 1
            heapq.heappush(self.decoding, (self.decoded + tokens, self._seq, ep))
        self.joining.clear()
        if not self.decoding:
            return
        step = self.cfg.step_a + self.cfg.step_b * len(self.decoding)
        steps = self.decoding[0][0] - self.decoded
        self.busy = True
        self.gen += 1
        self.chunk = (self.t, step, steps)
        self.clock.after(steps * step, self.on_engine, self.gen)

    def on_engine(self, gen: int) -> None:
        if gen != self.gen:
            return  # a chunk that was cut short
        _, step, steps = self.chunk
        self.busy = False
        self.decoded += steps
        self.engine_busy_s += steps * step
        while self.decoding and self.decoding[0][0] <= self.decoded:
            self.end_turn(heapq.heappop(self.decoding)[2])

    # -- trainer ---------------------------------------------------------------------------

    def group_done(self, g: int) -> None:
        self.ready.append(g)
        self.try_train()

    def try_train(self) -> None:
        b = self.cfg.batch_groups
        if self.training or len(self.ready) < b:
            return
        self.training = True
        batch = [self.ready.popleft() for _ in range(b)]
        self.clock.at(self.t + self.cfg.train_s + self.cfg.sync_s, self.on_trained, batch)

    def on_trained(self, batch: list[int]) -> None:
        self.training = False
        self.trainer_busy_s += self.cfg.train_s + self.cfg.sync_s
        self.staleness_seen += [self.version - self.launch_version[g] for g in batch]
        self.trained += batch
        self.version += 1
        self.launch()
        self.try_train()


def simulate(workload: Workload, cfg: SimConfig, *, staleness: int | None = None) -> Result:
    """Run ``workload`` under ``cfg`` with ``staleness`` (default: ``cfg.staleness``; 0 is the
    synchronous schedule) until ``cfg.steps`` trainer steps are done."""
    cfg.check()
    k = cfg.staleness if staleness is None else staleness
    if k < 0:
        raise ReplayError(f"staleness={k} must be >= 0")
    steps = cfg.steps if cfg.steps is not None else len(workload.groups) // cfg.batch_groups
    if not workload.groups or steps < 1:
        raise ReplayError(f"the workload ({workload.source or 'unnamed'}) has "
                          f"{len(workload.groups)} groups, fewer than one trainer step of "
                          f"{cfg.batch_groups}; lower --batch-groups or pass --steps")
    sim = _Sim(workload, cfg, k, steps)
    wall = sim.run()
    trained = [ep for g in sim.trained for ep in sim.eps[g]]
    return Result(schedule="sync" if k == 0 else "async", staleness=k, wall_s=wall, steps=steps,
                  samples=sum(ep.episode.samples for ep in trained),
                  trainer_busy_s=sim.trainer_busy_s, engine_busy_s=sim.engine_busy_s,
                  episodes=[(ep.start, ep.end) for ep in trained],
                  staleness_seen=sim.staleness_seen)


@dataclass
class Comparison:
    sync: Result
    async_: Result

    @property
    def speedup(self) -> float:
        """Asynchronous over synchronous effective samples/s (the same steps and samples, so
        also synchronous over asynchronous wall time)."""
        s = self.sync.samples_per_s
        return self.async_.samples_per_s / s if s > 0 else float("inf")

    def summary(self) -> dict[str, Any]:
        return {"sync": self.sync.summary(), "async": self.async_.summary(),
                "speedup": self.speedup}


def compare(workload: Workload, cfg: SimConfig) -> Comparison:
    """The synchronous schedule and the asynchronous one with ``cfg.staleness`` (at least 1)."""
    return Comparison(simulate(workload, cfg, staleness=0),
                      simulate(workload, cfg, staleness=max(1, cfg.staleness)))
