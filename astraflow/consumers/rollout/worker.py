"""The rollout worker: a consumer of ``tasks`` and a producer of ``trajectories``, nothing more.

It runs up to ``max_concurrent_episodes`` episodes at once, ``n_samples`` per task, with
trajectory ids ``"{group_id}/{policy}/{sample_index}"`` (a redelivered task yields recognisable
duplicates). Per partition it commits only the contiguous prefix of finished tasks, after their
trajectories are flushed (:mod:`astraflow.core.commits`); SIGTERM drains
(:mod:`~astraflow.consumers.rollout.drain`). Bus calls run on a thread of their own, engines on
theirs, workflows on the event loop. The long form: docs/rollout.md, "Worker semantics".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from astraflow.consumers.rollout.admission import Admission
from astraflow.consumers.rollout.context import EpisodeContext
from astraflow.consumers.rollout.drain import InFlight, oldest_versions, pick_releases, stale_by
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.consumers.rollout.trajectories import build_trajectories
from astraflow.consumers.rollout.weights import WeightFollower
from astraflow.core.bus.types import Bus, Message
from astraflow.core.claims import BlobStore
from astraflow.core.errors import SchemaError
from astraflow.core.limits import send_or_shrink
from astraflow.core.metrics import MetricsEmitter, component_id, process_age
from astraflow.core.outoforder import BusThread, Coalesced, OutOfOrder
from astraflow.core.records import Task, Trajectory, decode
from astraflow.core.registry import RegistryError
from astraflow.core.stream import DeadLetters, Output, Stop, send
from astraflow.core.topics import group_name, record_key, topic_name

log = logging.getLogger("astraflow.rollout.worker")

MAX_SAMPLES = 4096


class TaskRejected(ValueError):
    """A task that decodes but cannot be run (it goes to the DLQ)."""


@dataclass
class WorkerStats:
    tasks_taken: int = 0
    tasks_done: int = 0
    tasks_dead_lettered: int = 0
    tasks_released: int = 0
    episodes: int = 0
    episodes_failed: int = 0
    trajectories: int = 0
    tokens_generated: int = 0
    reward_failures: int = 0
    replies: int = 0  # assistant turns generated
    replies_truncated: int = 0  # of them, cut by the engine (max_new_tokens reached)
    tool_calls: int = 0
    tool_failures: int = 0
    tool_timeouts: int = 0
    commits: int = 0
    commit_errors: int = 0
    # the drain: of the tasks in flight when it began, those finished, those released as
    # stale, those released because a released stale task precedes them on their partition,
    # and those still running at drain_timeout (released); each release also counts in
    # tasks_released
    drained_finished: int = 0
    drained_released_stale: int = 0
    drained_released_behind: int = 0
    drained_released_timeout: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_STAT_NAMES = frozenset(f.name for f in fields(WorkerStats))


@dataclass
class _Running:
    msg: Message
    task: Task
    epoch: int
    n: int
    contexts: list[EpisodeContext] = field(default_factory=list)  # its episodes' so far
    producing: bool = False  # its trajectories are produced or being produced


class RolloutWorker:
    """See the module docstring. ``runtime`` holds the engines, reward and workflows.
    ``drain_max_staleness``: the staleness bound of the run's staleness filter, one for every
    policy or per policy (a policy absent has none); None: a drain finishes every task in
    flight (within ``drain_timeout``)."""

    def __init__(self, bus: Bus, runtime: Runtime, *, run: str, worker_id: str | None = None,
                 group: str | None = None, max_concurrent_episodes: int = 32,
                 episode_timeout: float | None = None, session_timeout: float = 10.0,
                 drain_timeout: float = 30.0, poll_timeout: float = 0.1,
                 commit_interval: float = 0.2, metrics_interval: float = 2.0,
                 followers: Sequence[WeightFollower] = (),
                 claims: BlobStore | None = None,
                 drain_max_staleness: int | Mapping[str, int] | None = None) -> None:
        self.bus = bus
        self.claims = claims  # oversized trajectories go here by claim check (None: failed)
        self.runtime = runtime
        self.run_name = run
        self.worker_id = worker_id or component_id("rollout")
        self.group = group or group_name(run, "rollout")
        self.max_concurrent = max_concurrent_episodes
        self.episode_timeout = episode_timeout
        self.session_timeout = session_timeout
        self.drain_timeout = drain_timeout
        self.drain_max_staleness: dict[str, int] | None = (
            None if drain_max_staleness is None
            else dict.fromkeys(runtime.engines, drain_max_staleness)
            if isinstance(drain_max_staleness, int) else dict(drain_max_staleness))
        self.poll_timeout = poll_timeout
        self.commit_interval = commit_interval
        self.metrics_interval = metrics_interval
        self.followers = list(followers)
        self.tasks_topic = topic_name(run, "tasks")
        self.out_topic = topic_name(run, "trajectories")
        self.dlq_topic = topic_name(run, "dlq")
        self.stats = WorkerStats()
        self._stop_requested = False
        self._stream: OutOfOrder | None = None
        self._running: dict[asyncio.Task[None], _Running] = {}
        self._claimed = 0
        self._typical_n = 1
        self._rates = (time.monotonic(), 0, 0)
        # (time, replies, truncated) where the last truncated_fraction window began
        self._replies_seen = (time.monotonic(), 0, 0)
        self._admission = Admission(max_concurrent_episodes)

    # -- control ------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop taking tasks and drain (safe from a signal handler or another thread)."""
        self._stop_requested = True
        if self._stream is not None:
            self._stream.wake_threadsafe()

    def run(self, *, max_tasks: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> WorkerStats:
        """Run until ``max_tasks`` tasks were taken, ``timeout`` seconds passed, ``should_stop()``
        is true or :meth:`request_stop` is called; then drain, commit and leave the group."""
        asyncio.run(self.run_async(max_tasks=max_tasks, timeout=timeout, should_stop=should_stop))
        return self.stats

    async def run_async(self, *, max_tasks: int | None = None, timeout: float | None = None,
                        should_stop: Callable[[], bool] | None = None) -> WorkerStats:
        # The engines' models and tokenizers are hundreds of thousands of long-lived objects:
        # a full collection traverses them all (~0.1-0.2 s on a CPU, a stall of every episode)
        # and the episodes' garbage triggers one every few thousand episodes. Frozen, they are
        # left out of collections until the worker stops.
        gc.freeze()
        try:
            return await self._run(max_tasks, timeout, should_stop)
        finally:
            gc.unfreeze()

    async def _run(self, max_tasks: int | None, timeout: float | None,
                   should_stop: Callable[[], bool] | None) -> WorkerStats:
        self._episode_slots = asyncio.Semaphore(self.max_concurrent)
        self._thread = BusThread("af-rollout-bus")
        self._call = self._thread.call
        self._outbox = Coalesced(self._thread, self._produce, name="produce")
        self._producer = self.bus.producer(client_id=self.worker_id)
        self.metrics = MetricsEmitter(self.bus, run=self.run_name, role="rollout",
                                      component=self.worker_id, interval=self.metrics_interval)
        self.metrics.set("episodes_per_s", 0.0)
        self.metrics.set("gen_tokens_per_s", 0.0)
        stream = self._stream = OutOfOrder(
            self.bus, self._producer, self._thread, group=self.group, topics=[self.tasks_topic],
            client_id=self.worker_id, session_timeout=self.session_timeout,
            poll_timeout=self.poll_timeout, commit_interval=self.commit_interval,
            on_release=self._release, tick=self._tick, label=f"worker={self.worker_id} ")
        for f in self.followers:
            # catch up before the first task: a restarted worker's engines start from the
            # model directory (version 0), and tasks taken before the follower thread's first
            # look would be generated at that version
            try:
                await asyncio.to_thread(f.sync_now, 1.0)
            except Exception as e:  # noqa: BLE001 - the thread retries it; counted there
                f.failures += 1
                log.warning("initial weight sync failed policy=%s error=%s", f.policy, e)
            f.start()
        try:
            await stream.join()
            self._letters = DeadLetters(self.dlq_topic, component=self.worker_id,
                                        label=f"worker={self.worker_id} ")
            age = process_age()  # from the process's start: imports, engines, weights
            if age is not None:
                self.metrics.set_total("time.load_s", age)
            await self._call(self.metrics.emit, "starting")
            log.info("worker=%s joined group=%s topic=%s", self.worker_id, self.group,
                     self.tasks_topic)
            stop = Stop(max_tasks, timeout, lambda: self._stop_requested or (
                should_stop is not None and should_stop()))
            await stream.intake(stop, self._room, self._accept)
            log.info("worker=%s draining in_flight_tasks=%d", self.worker_id, len(self._running))
            await self._gauges()
            await self._call(self.metrics.emit, "draining")
            await self._drain()
        finally:
            await stream.stop_committer()
            await self._release_all()
            await self._outbox.wait()
            try:
                await stream.leave()  # the last flush and commit; leaves the group
            finally:
                await self._call(self._producer.flush)
                await self._call(self._producer.close)
                await self.runtime.close()
                for f in self.followers:
                    await asyncio.to_thread(f.close)
                await self._gauges(final=True)
                await self._call(self.metrics.close, "stopped")
                self._thread.close()
        log.info("worker=%s stopped %s", self.worker_id, self.stats.as_dict())
        return self.stats

    # -- taking tasks -------------------------------------------------------------------------
    def _room(self) -> int:
        """How many tasks to ask for (0: full); a task claims ``n_samples`` episodes."""
        free = self.max_concurrent - self._claimed
        return max(1, free // self._typical_n) if free > 0 else 0

    def _validate(self, task: Task) -> None:
        if not task.prompt:
            raise TaskRejected(f"task {task.id!r} has an empty prompt")
        if not 1 <= task.n_samples <= MAX_SAMPLES:
            raise TaskRejected(f"task {task.id!r}: n_samples={task.n_samples}, expected "
                               f"1..{MAX_SAMPLES}")
        self.runtime.workflow(task.workflow)  # RegistryError for an unknown workflow

    def _dead_letter(self, msg: Message, error: BaseException) -> None:
        send(self._producer, self._letters.letter(msg, error, group=self.group))
        self._producer.flush()

    async def _accept(self, msg: Message, epoch: int) -> None:
        self.stats.tasks_taken += 1
        try:
            task: Task = decode(msg.value, Task)
            self._validate(task)
        except (SchemaError, TaskRejected, RegistryError) as e:
            self.stats.tasks_dead_lettered += 1
            self.metrics.inc("dead_lettered")
            await self._call(self._dead_letter, msg, e)
            assert self._stream is not None
            self._stream.finish(msg, epoch)
            return
        self._claimed += task.n_samples
        self._typical_n = task.n_samples
        r = _Running(msg, task, epoch, task.n_samples)
        t = asyncio.create_task(self._run_task(r), name=f"task-{task.id}")
        self._running[t] = r

    # -- running tasks ------------------------------------------------------------------------
    async def _run_task(self, r: _Running) -> None:
        task, msg = r.task, r.msg
        try:
            await self._admission.admit(task.n_samples)
            episodes = [asyncio.ensure_future(self._episode(task, i, r.contexts))
                        for i in range(task.n_samples)]
            for t in episodes:
                t.add_done_callback(self._admission.episode_done)
            outcomes = await asyncio.gather(*episodes)
            r.producing = True
            # produced together with those of the tasks that finish meanwhile
            await self._outbox.put(self._records(task, outcomes))
            assert self._stream is not None
            if self._stream.finish(msg, r.epoch):
                self.stats.tasks_done += 1
                self.metrics.inc("tasks_done")
        finally:
            self._claimed -= task.n_samples
            self._running.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            if self._stream is not None:
                self._stream.wake()

    async def _episode(self, task: Task, index: int,
                       contexts: list[EpisodeContext]) -> EpisodeOutcome:
        async with self._episode_slots:
            ctx = EpisodeContext(self.runtime, task, index)
            contexts.append(ctx)  # the drain judges the task by its tokens' versions
            out = await run_episode(self.runtime, task, index, timeout=self.episode_timeout,
                                    ctx=ctx)
        stats, metrics = self.stats, self.metrics
        stats.episodes += 1
        metrics.inc("episodes")
        if out.error is not None:
            stats.episodes_failed += 1
            metrics.inc("failures")
            log.warning("episode failed task=%s sample=%d error=%s", task.id, index, out.error)
        if out.ctx.replies:
            stats.replies += out.ctx.replies
            stats.replies_truncated += out.ctx.replies_truncated
            metrics.inc("replies", out.ctx.replies)
            metrics.inc("replies_truncated", out.ctx.replies_truncated)
        if out.ctx.counters:
            for name, n in out.ctx.counters.items():
                if name in _STAT_NAMES:
                    setattr(stats, name, getattr(stats, name) + int(n))
                metrics.inc(name, n)
        return out

    def _records(self, task: Task, outcomes: Sequence[EpisodeOutcome]) -> list[Trajectory]:
        """The trajectories of a task's episodes (``outcomes[i]`` is sample ``i``)."""
        vector = {policy: engine.version for policy, engine in self.runtime.engines.items()}
        records, tokens = build_trajectories(task, outcomes, worker_id=self.worker_id,
                                             vector=vector)
        self.stats.tokens_generated += tokens
        self.metrics.inc("tokens", tokens)
        return records

    def _produce(self, records: list[Trajectory]) -> None:
        for rec in records:
            send_or_shrink(self._producer, Output(self.out_topic, rec,
                                                  record_key("trajectories", rec)),
                           claims=self.claims, limit=self.bus.max_message_bytes)
            self.stats.trajectories += 1
        self.metrics.inc("trajectories", len(records))
        for policy, n in Counter(r.policy for r in records).items():  # for the reporter
            self.metrics.inc(f"trajectories.{policy}", n)

    # -- releasing -----------------------------------------------------------------------------
    def _release(self, epochs: set[int]) -> None:
        for t, r in list(self._running.items()):
            if r.epoch in epochs and not t.done():
                t.cancel()
                self.stats.tasks_released += 1
                self.metrics.inc("tasks_released")
                log.info("released task=%s (partition revoked)", r.task.id)

    # -- draining -----------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Finish the tasks in flight for up to ``drain_timeout`` (with a staleness bound: the
        fresh ones; the stale ones are released at once); what is left is released after."""
        start = time.monotonic()
        running = set(self._running)
        if self.drain_max_staleness is None:
            if running and self.drain_timeout > 0:
                await asyncio.wait(running, timeout=self.drain_timeout)
        else:
            await self._drain_fresh(running, start + self.drain_timeout)
        stats = self.stats
        finished = sum(1 for t in running
                       if t.done() and not t.cancelled() and t.exception() is None)
        timed_out = sum(1 for t in running if not t.done())  # released by _release_all
        stats.drained_finished += finished
        stats.drained_released_timeout += timed_out
        self.metrics.inc("drained_finished", finished)
        self.metrics.inc("drained_released_timeout", timed_out)
        log.info("worker=%s drained in %.1f s: in_flight=%d finished=%d released_stale=%d "
                 "released_behind=%d released_timeout=%d", self.worker_id,
                 time.monotonic() - start, len(running), finished,
                 stats.drained_released_stale, stats.drained_released_behind, timed_out)

    async def _drain_fresh(self, running: set[asyncio.Task[None]], deadline: float) -> None:
        """Wait for ``running`` until ``deadline``, releasing the tasks that are (or become)
        stale; re-judged whenever a newer version is known."""
        pending = {t for t in running if not t.done()}
        seen: dict[str, int] | None = None
        while pending:
            newest = self._newest_versions()
            if newest != seen:  # a task ages only when a newer version appears
                seen = newest
                released = self._release_stale(newest)
                if released:
                    pending -= released
                    await asyncio.gather(*released, return_exceptions=True)
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                return
            _, pending = await asyncio.wait(pending, timeout=min(left, self.poll_timeout),
                                            return_when=asyncio.FIRST_COMPLETED)

    def _newest_versions(self) -> dict[str, int]:
        """Per hosted policy, the newest version known: on ``weights.<policy>`` as its
        follower read it, or its engine's."""
        newest = {p: e.version for p, e in self.runtime.engines.items()}
        for f in self.followers:
            if f.newest is not None:
                newest[f.policy] = max(newest.get(f.policy, f.newest), f.newest)
        return newest

    def _release_stale(self, newest: Mapping[str, int]) -> set[asyncio.Task[None]]:
        """Cancel the tasks :func:`~astraflow.consumers.rollout.drain.to_release` picks (not
        committed: the partition's next owner redoes them); returns them."""
        assert self.drain_max_staleness is not None and self._stream is not None
        bounds = self.drain_max_staleness
        in_flight = [((r.msg.topic, r.msg.partition, r.epoch), InFlight(
            t, r.msg.offset, stale_by(oldest_versions(r.contexts), newest, bounds) is not None,
            r.producing)) for t, r in self._running.items() if not t.done()]
        released: set[asyncio.Task[None]] = set()
        for f in pick_releases(in_flight, self._stream.newest_finished):
            task = f.key
            assert isinstance(task, asyncio.Task)
            task.cancel()
            released.add(task)
            name = "drained_released_stale" if f.stale else "drained_released_behind"
            setattr(self.stats, name, getattr(self.stats, name) + 1)
            self.metrics.inc(name)
            log.info("released task=%s (%s) newest=%s", self._running[task].task.id,
                     "stale" if f.stale else "behind a stale task on its partition", newest)
        self.stats.tasks_released += len(released)
        self.metrics.inc("tasks_released", len(released))
        return released

    async def _release_all(self) -> None:
        left = [t for t in self._running if not t.done()]
        for t in left:
            t.cancel()
        self.stats.tasks_released += len(left)
        self.metrics.inc("tasks_released", len(left))
        if left:
            log.info("worker=%s released %d unfinished tasks", self.worker_id, len(left))
        await asyncio.gather(*left, return_exceptions=True)

    # -- metrics ------------------------------------------------------------------------------
    async def _tick(self) -> None:
        """After each periodic commit: gauges, and a heartbeat when one is due."""
        await self._gauges()
        await self._call(self.metrics.tick, "draining" if self._stop_requested else "running")

    def _truncated_fraction(self, now: float, final: bool) -> None:
        """The share of replies the engines cut (finish reason ``length``) among those of the
        episodes finished in the last ``metrics_interval`` or more (the window ends at the
        stop too); kept as it was while no reply comes."""
        t0, n0, c0 = self._replies_seen
        n, c = self.stats.replies, self.stats.replies_truncated
        if n > n0 and (final or now - t0 >= self.metrics_interval):
            self.metrics.set("truncated_fraction", (c - c0) / (n - n0))
            self._replies_seen = (now, n, c)

    async def _gauges(self, final: bool = False) -> None:
        if self._stream is not None:
            self.stats.commits = self._stream.commits
            self.stats.commit_errors = self._stream.commit_errors
        now = time.monotonic()
        t0, e0, k0 = self._rates
        if now - t0 >= self.metrics_interval:
            dt = now - t0
            self.metrics.set("episodes_per_s", (self.stats.episodes - e0) / dt)
            self.metrics.set("gen_tokens_per_s", (self.stats.tokens_generated - k0) / dt)
            self._rates = (now, self.stats.episodes, self.stats.tokens_generated)
        self._truncated_fraction(now, final)
        self.metrics.set("inflight", self._claimed)
        self.metrics.set("max_inflight", self.max_concurrent)  # the reporter's utilization
        self.metrics.set("inflight_tasks", len(self._running))
        slowed = 0.0
        timed = False  # an engine that times its decoding (hf)
        for i, (policy, engine) in enumerate(self.runtime.engines.items()):
            timed = timed or hasattr(engine, "busy_seconds")
            self.metrics.set(f"weight_version.{policy}", engine.version)
            if i == 0:
                self.metrics.set("weight_version", engine.version)
                self.metrics.set("engine.speed", getattr(engine, "speed", 1.0))
            slowed += getattr(engine, "slowed_s", 0.0)
        # seconds the engines were held asleep by rollout.engine.speed (a running total)
        self.metrics.set_total("engine.slowed_s", slowed)
        # where the worker's time goes: decoding, by any of its engines (their stretches
        # overlap: counted once)
        if timed:
            from astraflow.consumers.rollout.engines.hf import DECODING

            self.metrics.set_total("time.generate_s", DECODING.seconds())
        for f in self.followers:  # a far worker's weight sync: lag, and where the time goes
            self.metrics.set(f"weights.lag.{f.policy}", f.lag)
            self.metrics.set_total(f"weights.fetch_s.{f.policy}", f.fetch_s)
            self.metrics.set_total(f"weights.apply_s.{f.policy}", f.apply_s)
            self.metrics.set_total(f"weights.fetched_bytes.{f.policy}",
                                   f.syncer.stats.fetched_bytes)
