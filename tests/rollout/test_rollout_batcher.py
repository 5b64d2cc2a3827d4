"""The engine batcher: one failed request fails its own episode, not its batch's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

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
