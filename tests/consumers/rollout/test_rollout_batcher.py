"""The engine batcher: one failed request fails its own episode, not its batch's; its mean
batch is requests per engine call, or unknown where the engine batches itself unseen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from waiting import wait_for

from astraflow.consumers.rollout.batcher import Batcher
from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult


class OneAborts:
    """Answers every request with its prompt; the request whose prompt is [13] is aborted."""

    name = "one-aborts"
    max_batch_size = 8

    def __init__(self, continuous: bool) -> None:
        self.continuous = continuous
        self.batches: list[int] = []

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        self.batches.append(len(requests))
        return [GenResult([], [], [], "stop", error="aborted by the engine")
                if list(r.prompt_ids) == [13] else
                GenResult(list(r.prompt_ids), [-1.0], [0], "stop") for r in requests]


@pytest.mark.parametrize("continuous", [False, True])
def test_a_failed_request_fails_alone(continuous: bool) -> None:
    engine = OneAborts(continuous)

    async def main() -> list[object]:
        b = Batcher(engine)
        try:
            return await asyncio.gather(*(b.generate(GenRequest([p])) for p in (11, 13, 17)),
                                        return_exceptions=True)
        finally:
            await b.close()

    ok1, failed, ok2 = asyncio.run(main())
    assert isinstance(failed, EngineError) and "aborted" in str(failed)
    assert isinstance(ok1, GenResult) and ok1.token_ids == [11]
    assert isinstance(ok2, GenResult) and ok2.token_ids == [17]
    if not continuous:
        assert engine.batches == [3]  # one batch: the abort did not take the others with it


@pytest.mark.parametrize("continuous", [False, True])
def test_the_mean_batch_is_requests_per_engine_call(continuous: bool) -> None:
    """A batched engine: requests per generate call. One that batches itself gets a call per
    request, which is no batch (the continuous hf engine's own step counts are checked in
    test_rollout_engine_hf_continuous); without such counts its mean batch is unknown."""
    engine = OneAborts(continuous)

    async def main() -> Batcher:
        b = Batcher(engine)
        try:
            assert b.mean_batch is None  # nothing batched yet
            await asyncio.gather(*(b.generate(GenRequest([p])) for p in (1, 2, 3, 4)))
            await b.generate(GenRequest([5]))
            return b
        finally:
            await b.close()

    b = asyncio.run(main())
    assert (b.requests, b.tokens) == (5, 5)
    if continuous:
        assert b.batches == 0 and b.mean_batch is None
    else:
        assert engine.batches == [4, 1] and b.batches == 2 and b.mean_batch == 2.5


def test_engine_latency_is_one_draw_per_request_before_the_engine() -> None:
    """``rollout.engine.latency`` (an emulated slow server): every request waits one draw of
    the spec before it reaches the engine; the waits overlap (no core held), so the requests
    still meet in one batch."""
    import random

    draws: list[int] = []

    class Counting:
        def sample(self, rng: random.Random) -> float:
            draws.append(1)
            return 0.05

        def quantile(self, q: float) -> float:
            return 0.05

    engine = OneAborts(continuous=False)

    async def main() -> list[GenResult]:
        b = Batcher(engine, latency=Counting())
        try:
            return await asyncio.gather(*(b.generate(GenRequest([p])) for p in (1, 2, 3, 4)))
        finally:
            await b.close()

    results = asyncio.run(main())
    assert [list(r.token_ids) for r in results] == [[1], [2], [3], [4]]
    assert len(draws) == 4
    assert engine.batches == [4]  # the four waits overlapped: one batch, not four


def test_engine_latency_config_is_checked_at_load() -> None:
    from astraflow.consumers.rollout.config import EngineConfig

    assert EngineConfig(latency=0.5).latency == 0.5
    assert EngineConfig(latency={"type": "lognormal", "p50": 0.1, "p99": 1.0}).latency
    with pytest.raises(ValueError, match="rollout.engine.latency"):
        EngineConfig(latency={"type": "lognormal", "p50": 2.0})


class Held:
    """A batched engine that takes two batches at once (``pipeline_depth`` 2) and runs each
    until the test releases it; it records what it was handed, in order."""

    name = "held"
    max_batch_size = 4
    continuous = False
    pipeline_depth = 2

    def __init__(self) -> None:
        import threading

        self.handed: list[list[int]] = []
        self.release = threading.Semaphore(0)
        self.lock = threading.Lock()

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        with self.lock:
            self.handed.append([r.prompt_ids[0] for r in requests])
        self.release.acquire()
        return [GenResult(list(r.prompt_ids), [-1.0], [0], "stop") for r in requests]


def test_a_pipelined_engine_gets_a_second_batch_only_when_full() -> None:
    """Two batches in the engine at most; while it is busy a second goes to it only once
    full, so batches stay full; the rest goes when it is idle."""
    engine = Held()

    async def until(cond: Callable[[], object], what: str) -> None:
        # the shared wait, polled on a thread so that the loop (and the batcher) runs meanwhile
        await asyncio.to_thread(wait_for, cond, 5.0, what, every=0.01)

    async def main() -> list[object]:
        b = Batcher(engine)
        try:
            first = [asyncio.ensure_future(b.generate(GenRequest([p]))) for p in range(6)]
            await until(lambda: len(engine.handed) == 1, "the first batch")
            await asyncio.sleep(0.1)
            assert engine.handed == [[0, 1, 2, 3]]  # [4, 5] wait: not a full batch
            more = [asyncio.ensure_future(b.generate(GenRequest([p]))) for p in range(6, 10)]
            await until(lambda: len(engine.handed) == 2, "a full second batch")
            assert engine.handed[1] == [4, 5, 6, 7]
            await asyncio.sleep(0.1)
            assert len(engine.handed) == 2  # never three at once
            engine.release.release()  # the first ends: [8, 9] still not full, one is running
            await asyncio.sleep(0.1)
            assert len(engine.handed) == 2
            engine.release.release()  # idle now: the rest goes
            await until(lambda: len(engine.handed) == 3, "the rest")
            assert engine.handed[2] == [8, 9]
            engine.release.release()
            return await asyncio.gather(*first, *more)
        finally:
            await b.close()

    results = asyncio.run(main())
    assert [r.token_ids for r in results] == [[p] for p in range(10)]  # type: ignore[attr-defined]
