"""Claim checks: a record over the bus's limit travels as a Claim, its bytes in a blob store;
the runtime and the trainer's fetch resolve it, so handlers see the original record."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from astraflow.consumers.trainer.loop import resolve
from astraflow.core.bus import connect
from astraflow.core.claims import encode_for_bus, is_claim, unclaim
from astraflow.core.errors import SchemaError
from astraflow.core.records import (
    Batch,
    Claim,
    DeadLetter,
    Group,
    Trajectory,
    TrajRef,
    decode,
    pack_f32,
    pack_i32,
    pack_u8,
)
from astraflow.core.stream import Input, Output, Processor, Stateless
from astraflow.weights import FileStore


def long_episode(tid: str, n: int) -> Trajectory:
    return Trajectory(id=tid, task_id="t", group_id="g", token_ids=pack_i32(range(n)),
                      loss_mask=pack_u8([1] * n), logprobs=pack_f32([-1.0] * n),
                      versions=pack_i32([0] * n), reward=1.0)


def test_small_records_stay_and_large_ones_are_claimed(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    small, big = long_episode("s", 10), long_episode("b", 20_000)
    value, headers = encode_for_bus(small, limit=100_000, store=store)
    assert decode(value, Trajectory) == small and headers[0][1] == b"Trajectory/1"
    value, headers = encode_for_bus(big, limit=100_000, store=store)
    claim = decode(value, Claim)
    assert isinstance(claim, Claim) and claim.schema_of == "Trajectory" and len(value) < 1000
    from astraflow.core.bus.types import Message

    msg = Message("t", 0, 7, b"g", value, headers)
    assert is_claim(msg)
    assert decode(unclaim(msg, store).value, Trajectory) == big
    with pytest.raises(SchemaError, match="no claim store"):
        unclaim(msg, None)
    (tmp_path / "store" / claim.uri).write_bytes(b"\x00" * claim.size)  # corrupted on disk
    with pytest.raises(SchemaError, match="does not match its claim"):
        unclaim(msg, store)
    # no store: the record is left as it is (the producer refuses it)
    assert encode_for_bus(big, limit=100_000, store=None)[1][0][1] == b"Trajectory/1"


def test_the_runtime_resolves_claims_for_its_handler(bus_url: str, tmp_path: Path) -> None:
    bus = connect(bus_url)
    store = FileStore(tmp_path / "store")
    src, dst, dlq = (f"claims-{k}-{uuid.uuid4().hex[:6]}" for k in ("in", "out", "dlq"))
    bus.create_topics({src: 2, dst: 1, dlq: 1})
    big = long_episode("big", 200_000)  # ~2.6 MB: over the 1 MB bus limit
    producer = bus.producer()
    value, headers = encode_for_bus(big, limit=bus.max_message_bytes, store=store, key=b"g")
    producer.produce(src, value, key=b"g", headers=headers)
    value, headers = encode_for_bus(long_episode("gone", 200_000), limit=bus.max_message_bytes,
                                    store=FileStore(tmp_path / "elsewhere"), key=b"g")
    producer.produce(src, value, key=b"g", headers=headers)  # its blob is not in our store
    producer.flush()
    seen: list[Trajectory] = []

    def copy(t: Trajectory, msg):
        seen.append(t)
        return [Output(dst, t, b"g")]

    proc = Processor(bus, Stateless(), [Input([src], f"g-{uuid.uuid4().hex[:6]}",
                                              lambda m: decode(m.value, Trajectory), copy)],
                     dlq=dlq, claims=store)
    stats = proc.run(max_records=2, timeout=30)
    proc.close()
    assert [t.id for t in seen] == ["big"] and seen[0] == big
    assert stats["dead_lettered"] == 1
    out = list(_read(bus, dst))
    assert len(out) == 1 and is_claim(out[0])  # the output went by claim check too
    assert decode(unclaim(out[0], store).value, Trajectory) == big
    dead = [decode(m.value, DeadLetter) for m in _read(bus, dlq)]
    assert len(dead) == 1 and "cannot be read" in dead[0].error
    bus.close()


def test_the_trainer_fetch_resolves_claimed_trajectories(bus_url: str, tmp_path: Path) -> None:
    bus = connect(bus_url)
    store = FileStore(tmp_path / "store")
    topic = f"claims-traj-{uuid.uuid4().hex[:6]}"
    bus.create_topics({topic: 1})
    trajs = [long_episode("a", 5), long_episode("b", 90_000)]
    producer = bus.producer()
    for t in trajs:
        value, headers = encode_for_bus(t, limit=bus.max_message_bytes, store=store)
        producer.produce(topic, value, partition=0, headers=headers)
    producer.flush()
    batch = Batch(id="p-0", policy="p", seq=0, groups=[Group(group_id="g", task_id="t", refs=[
        TrajRef(t.id, topic, 0, i, i, 1.0) for i, t in enumerate(trajs)])])
    got = resolve(bus, batch, store)
    assert got.groups[0].trajectories == trajs and not got.groups[0].refs
    with pytest.raises(SchemaError, match="no claim store"):
        resolve(bus, batch, None)
    bus.close()


def _read(bus, topic: str):
    from astraflow.core.bus.reader import read_all

    return read_all(bus, topic, idle_timeout=10)


def test_send_claims_what_the_bus_would_refuse(tmp_path: Path) -> None:
    from astraflow.core.errors import RecordTooLargeError
    from astraflow.core.stream import send

    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics({"t": 1})
    producer = bus.producer()
    big = long_episode("big", 100_000)  # 1.3 MB
    with pytest.raises(RecordTooLargeError):  # no store: refused, as before claim checks
        send(producer, Output("t", big, b"g"))
    store = FileStore(tmp_path / "store")
    send(producer, Output("t", big, b"g"), claims=store, limit=bus.max_message_bytes)
    send(producer, Output("t", long_episode("small", 3), b"g"), claims=store)
    producer.flush()
    msgs = list(_read(bus, "t"))
    assert [is_claim(m) for m in msgs] == [True, False]
    assert decode(unclaim(msgs[0], store).value, Trajectory) == big
    assert msgs[0].key == b"g"
    bus.close()
