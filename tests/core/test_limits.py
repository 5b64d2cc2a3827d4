"""The size rules every producer of trajectories shares (core/limits.py): a trajectory the bus
refuses goes as its small stand-in under the same key; any other record too large still
raises; error texts are cut."""

from __future__ import annotations

import pytest

from astraflow.core.errors import RecordTooLargeError
from astraflow.core.limits import MAX_ERROR_CHARS, error_text, send_or_shrink, too_large
from astraflow.core.outputs import Output
from astraflow.core.records import GatewayCall, Trajectory, decode, pack_f32, pack_i32, pack_u8


class SmallProducer:
    """Refuses values over ``limit`` bytes, as a bus does; keeps what it accepts."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent: list[tuple[str, bytes, bytes | None, int | None]] = []

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None,
                headers: object = None, partition: int | None = None) -> None:
        if len(value) > self.limit:
            raise RecordTooLargeError(f"record of {len(value)} bytes over {self.limit}")
        self.sent.append((topic, value, key, partition))

    def flush(self, timeout: float | None = None) -> None:
        pass


def trajectory(n_tokens: int) -> Trajectory:
    return Trajectory(id="g#0/default/1", task_id="g", group_id="g#0", policy="default",
                      sample_index=1, group_size=2, token_ids=pack_i32(range(n_tokens)),
                      loss_mask=pack_u8([1] * n_tokens), logprobs=pack_f32([-1.0] * n_tokens),
                      versions=pack_i32([3] * n_tokens), prompt_len=0, reward=1.0,
                      worker_id="w", version_vector={"default": 3})


def test_a_trajectory_that_fits_goes_as_it_is() -> None:
    p = SmallProducer(limit=4096)
    rec = trajectory(10)
    assert send_or_shrink(p, Output("t", rec, b"g#0"), claims=None, limit=4096) is False
    ((topic, value, key, _),) = p.sent
    assert (topic, key) == ("t", b"g#0")
    assert decode(value, Trajectory) == rec


def test_a_trajectory_too_large_goes_as_its_stand_in_under_the_same_key() -> None:
    p = SmallProducer(limit=2048)
    rec = trajectory(4000)
    assert send_or_shrink(p, Output("t", rec, b"g#0", 1), claims=None, limit=2048) is True
    ((topic, value, key, partition),) = p.sent
    assert (topic, key, partition) == ("t", b"g#0", 1)
    small = decode(value, Trajectory)
    assert small.finish_reason == "error" and small.token_ids == b""
    assert (small.id, small.group_id, small.sample_index, small.version_vector) == (
        rec.id, rec.group_id, rec.sample_index, rec.version_vector)
    assert small.error is not None and small.error.startswith("trajectory too large for the bus")


def test_another_record_too_large_still_raises() -> None:
    p = SmallProducer(limit=64)
    call = GatewayCall(session_id="s" * 200, seq=0, kind="call")
    with pytest.raises(RecordTooLargeError):
        send_or_shrink(p, Output("t", call), claims=None, limit=64)
    assert p.sent == []


def test_error_texts_are_cut() -> None:
    assert error_text("x" * (MAX_ERROR_CHARS + 10)) == "x" * MAX_ERROR_CHARS
    small = too_large(trajectory(3), ValueError("y" * 3 * MAX_ERROR_CHARS))
    assert small.error is not None and len(small.error) == MAX_ERROR_CHARS
