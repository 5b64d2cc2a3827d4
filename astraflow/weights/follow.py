"""Reading ``weights.<policy>``: what the syncer and the mirror share.

Both follow the topic from its first record with a group-less reader and want, at each look,
every manifest published so far: :func:`read_new` reads up to the end offsets seen when it is
called (waiting for records known to exist, however the client batches its fetches), and
:func:`decode_manifest` turns a record into a manifest of the expected policy or says why not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from astraflow.core.bus.types import Bus, Message, Reader
from astraflow.core.errors import SchemaError
from astraflow.core.records import WeightManifest, decode

log = logging.getLogger("astraflow.weights.follow")


def read_new(bus: Bus, reader: Reader, topic: str, take: Callable[[Message], None], *,
             timeout: float = 0.0, max_records: int | None = None) -> int:
    """Hand every record of ``topic`` that ``reader`` has not read yet, up to the end offsets
    now, to ``take``; when there is none, wait up to ``timeout`` seconds for the first new one.
    Stops early after ``max_records``. Returns how many records were read."""
    ends = bus.describe_topic(topic).end_offsets
    behind = {p: end for p, end in ends.items() if end > reader.position(p)}
    deadline = time.monotonic() + timeout
    got = 0
    while max_records is None or got < max_records:
        if behind:  # records exist that we have not read: wait for them (bounded)
            wait = max(1.0, deadline - time.monotonic())
        else:  # caught up: wait only for the first new record
            wait = 0.0 if got else max(0.0, deadline - time.monotonic())
        n = 500 if max_records is None else min(500, max_records - got)
        msgs = reader.consume(n, wait)
        if not msgs:
            break
        for msg in msgs:
            if behind.get(msg.partition, -1) <= msg.offset + 1:
                behind.pop(msg.partition, None)
            take(msg)
        got += len(msgs)
    return got


def decode_manifest(msg: Message, policy: str) -> WeightManifest | None:
    """The manifest in ``msg`` when it is one of ``policy``'s; None (logged) when the record is
    not a manifest or belongs to another policy."""
    try:
        m = cast(WeightManifest, decode(msg.value, WeightManifest))
    except SchemaError as e:
        log.warning("skipped record origin=%s error=%s", msg.origin, e)
        return None
    if m.policy != policy:
        log.warning("skipped manifest of policy=%s on %s's topic origin=%s", m.policy, policy,
                    msg.origin)
        return None
    return m
