"""What a Trajectory becomes when it does not fit: the one rule for every producer of them.

A trajectory too large for the bus and the claim store is never dropped: :func:`send_or_shrink`
produces a stand-in with the same ids, role and version vector, no tokens and
``finish_reason="error"``, so its group still hears of the sample. Error texts are cut to
:data:`MAX_ERROR_CHARS` (:func:`error_text`)."""

from __future__ import annotations

import dataclasses

import msgspec

from astraflow.core.bus.types import Producer
from astraflow.core.claims import BlobStore
from astraflow.core.errors import RecordTooLargeError
from astraflow.core.outputs import Output, send
from astraflow.core.records import Trajectory

MAX_ERROR_CHARS = 2000  # an episode's error text on a trajectory is cut to this


def error_text(text: str) -> str:
    """``text`` as it may stand on a trajectory (its first :data:`MAX_ERROR_CHARS`)."""
    return text[:MAX_ERROR_CHARS]


def too_large(rec: Trajectory, error: Exception) -> Trajectory:
    """What stands on the bus for ``rec``, too large for it: the same id, group, policy,
    role, sample and version vector, no tokens, ``"error"``."""
    return msgspec.structs.replace(
        rec, token_ids=b"", loss_mask=b"", logprobs=b"", versions=b"", prompt_len=0,
        spans=[], reward=0.0, rewards={}, turn_rewards=[], finish_reason="error",
        error=error_text(f"trajectory too large for the bus: {error}"))


def send_or_shrink(producer: Producer, out: Output, *, claims: BlobStore | None,
                   limit: int) -> bool:
    """Send ``out``; a Trajectory the bus refuses as too large is replaced by its
    :func:`too_large` stand-in (same topic, key and partition). Whether it was replaced; any other
    record too large raises :class:`RecordTooLargeError`."""
    try:
        send(producer, out, claims=claims, limit=limit)
        return False
    except RecordTooLargeError as e:
        if not isinstance(out.record, Trajectory):
            raise
        send(producer, dataclasses.replace(out, record=too_large(out.record, e)))
        return True
