"""The async front of an engine: collects the requests of concurrent episodes into batches.

Episodes ``await batcher.generate(request)``. One loop per engine runs :meth:`Engine.generate`
on the pending requests (up to ``max_batch_size``) in the engine's thread while it collects the
next batch; an engine with ``pipeline_depth`` > 1 is handed that many full batches at once.
Engines that batch themselves (``continuous``) get each request on its own call, or through
their ``submit``. :attr:`Batcher.mean_batch` is what batching achieved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from astraflow.consumers.rollout.engines.base import Engine, EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.latency import parse_latency, wait

log = logging.getLogger("astraflow.rollout.batcher")


def step_counts(engine: Engine) -> tuple[int, int] | None:
    """(sequences, steps): what an engine that schedules itself has decoded so far, the
    sequences summed over its decoding steps and the steps, where it counts them (the
    continuous ``hf`` engine's decoder; a slowed engine reads through to it); else None."""
    decoder = getattr(engine, "decoder", None) if getattr(engine, "continuous", False) else None
    if decoder is None:
        return None
    return decoder.row_steps, decoder.iterations


class Batcher:
    """Batches :class:`GenRequest` s of many coroutines onto one engine."""

    def __init__(self, engine: Engine, *, max_batch_size: int | None = None,
                 latency: Any = None, seed: int = 0) -> None:
        self.engine = engine
        self.latency = parse_latency(latency, where="rollout.engine.latency")
        self._rng = random.Random(f"engine-latency/{engine.name}/{seed}")
        self.max_batch_size = max_batch_size or engine.max_batch_size
        self.continuous = bool(getattr(engine, "continuous", False))
        self._submit = getattr(engine, "submit", None) if self.continuous else None
        self.depth = 1 if self.continuous else max(1, int(getattr(engine, "pipeline_depth", 1)))
        workers = self.max_batch_size if self.continuous else self.depth
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"af-engine-{engine.name}")
        self._queue: list[tuple[GenRequest, asyncio.Future[GenResult]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # batches handed to the engine
        self._slots: asyncio.Semaphore | None = None
        self.batches = 0  # Engine.generate calls with a batch (0 when the engine batches itself)
        self.requests = 0  # requests answered
        self.tokens = 0  # tokens generated for them
        self._steps0 = step_counts(engine)  # the engine's own counts when this batcher began

    @property
    def mean_batch(self) -> float | None:
        """Sequences per engine batch since this batcher was made: requests per
        :meth:`Engine.generate` call of a batched engine; sequences per decoding step of an
        engine that schedules itself and counts them (:func:`step_counts`); None before the
        first batch, or for an engine that batches itself out of sight (``openai``)."""
        if not self.continuous:
            return self.requests / self.batches if self.batches else None
        now = step_counts(self.engine)
        if now is None or self._steps0 is None or now[1] == self._steps0[1]:
            return None
        return (now[0] - self._steps0[0]) / (now[1] - self._steps0[1])

    async def generate(self, request: GenRequest) -> GenResult:
        if self.latency is not None:  # an emulated slow server: the wait holds no core
            await wait(self.latency, self._rng)
        loop = asyncio.get_running_loop()
        if self._submit is not None:
            res = await asyncio.wrap_future(self._submit(request))
            self._count(0, [res])
            if res.error is not None:
                raise EngineError(res.error)
            return res
        if self.continuous:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.max_batch_size)
            async with self._slots:
                (res,) = await loop.run_in_executor(self._pool, self.engine.generate, [request])
            self._count(0, [res])
            if res.error is not None:
                raise EngineError(res.error)
            return res
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.engine.name}")
        fut: asyncio.Future[GenResult] = loop.create_future()
        self._queue.append((request, fut))
        assert self._wake is not None
        self._wake.set()
        return await fut

    def _count(self, batches: int, results: list[GenResult]) -> None:
        self.batches += batches
        self.requests += len(results)
        self.tokens += sum(len(r.token_ids) for r in results)

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and len(self._running) < self.depth:
                # drop requests whose episode was cancelled while they waited
                self._queue = [(r, f) for r, f in self._queue if not f.done()]
                if self._running and len(self._queue) < self.max_batch_size:
                    break  # the engine is busy: a second batch goes only once full
                batch, self._queue = (self._queue[:self.max_batch_size],
                                      self._queue[self.max_batch_size:])
                if not batch:
                    break
                task = asyncio.create_task(self._run(batch))
                self._running.add(task)

    async def _run(self, batch: list[tuple[GenRequest, asyncio.Future[GenResult]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self._pool, self.engine.generate, [r for r, _ in batch])
        except Exception as e:  # noqa: BLE001 - the episodes fail, the worker goes on
            log.warning("engine=%s batch of %d failed: %s", self.engine.name, len(batch), e)
            self._done()
            for _, f in batch:
                if not f.done():
                    f.set_exception(e)
            return
        self._done()  # first: the next batch is handed over before these episodes go on
        self._count(1, results)
        for (_, f), res in zip(batch, results, strict=True):
            if f.done():
                continue
            if res.error is not None:  # this request alone failed
                f.set_exception(EngineError(res.error))
            else:
                f.set_result(res)

    def _done(self) -> None:
        self._running.discard(asyncio.current_task())
        assert self._wake is not None
        self._wake.set()

    async def close(self) -> None:
        for task in [t for t in (self._task, *self._running) if t is not None]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
        self._running.clear()
        for _, f in self._queue:
            if not f.done():
                f.cancel()
        self._queue.clear()
        self._pool.shutdown(wait=True)


class RoutedBatcher:
    """The batcher of one adapter policy of an engine serving several (an
    :class:`~astraflow.consumers.rollout.engines.adapters.AdapterView`): its requests join the
    shared engine's one batcher, marked with the adapter, so rows of every adapter share a
    forward pass. Everything else (counts, ``mean_batch``) is the shared batcher's."""

    def __init__(self, shared: Batcher, adapter: str) -> None:
        self.shared = shared
        self.adapter = adapter

    def __getattr__(self, name: str) -> Any:
        if name == "shared":
            raise AttributeError(name)
        return getattr(self.shared, name)

    async def generate(self, request: GenRequest) -> GenResult:
        import dataclasses

        return await self.shared.generate(dataclasses.replace(request, adapter=self.adapter))

    async def close(self) -> None:
        await self.shared.close()  # idempotent: every view's batcher closes the one


def batchers_for(engines: dict[str, Engine], *, latency: Any = None) -> dict[str, Batcher]:
    """A batcher per policy; the adapter views of one shared engine (their ``shared``) get
    one batcher over it between them (:class:`RoutedBatcher`): an engine has exactly one."""
    out: dict[str, Any] = {}
    shared: dict[int, Batcher] = {}
    for policy, e in engines.items():
        base = getattr(e, "shared", None)
        if base is None:
            out[policy] = Batcher(e, latency=latency)
            continue
        b = shared.get(id(base))
        if b is None:
            b = shared[id(base)] = Batcher(base, latency=latency)
        out[policy] = RoutedBatcher(b, getattr(e, "policy", policy))
    return out
