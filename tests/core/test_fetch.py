"""Fetching records by address (what the trainer does with a batch's references), on both
backends: near and far offsets, several partitions, and records that are not there."""

from __future__ import annotations

import uuid

import pytest

from astraflow.core.bus import connect
from astraflow.core.fetch import RecordGoneError, fetch


def _topic(bus, partitions: int = 4) -> str:
    name = f"fetch-{uuid.uuid4().hex[:8]}"
    bus.create_topics({name: partitions})
    return name


def test_fetches_exactly_the_addressed_records(bus_url: str) -> None:
    bus = connect(bus_url)
    topic = _topic(bus)
    producer = bus.producer()
    for i in range(400):
        producer.produce(topic, f"v{i}".encode(), partition=i % 4)
    producer.flush()
    # near each other, far apart (past the seek gap), first and last of a partition
    wanted = [(0, 0), (0, 1), (0, 2), (0, 99), (1, 50), (1, 51), (2, 10), (2, 80), (3, 99)]
    got = fetch(bus, topic, wanted + [(0, 1)], max_gap=8)  # a repeated address counts once
    assert sorted(got) == sorted(wanted)
    for (p, o), msg in got.items():
        assert (msg.partition, msg.offset) == (p, o)
        assert msg.value == f"v{o * 4 + p}".encode()
    assert fetch(bus, topic, []) == {}
    bus.close()


def test_a_missing_record_is_named(bus_url: str) -> None:
    bus = connect(bus_url)
    topic = _topic(bus, 2)
    producer = bus.producer()
    for _ in range(5):
        producer.produce(topic, b"x", partition=0)
    producer.flush()
    with pytest.raises(RecordGoneError, match=r"\[0\]@5"):
        fetch(bus, topic, [(0, 1), (0, 5)])
    with pytest.raises(RecordGoneError, match=r"\[1\]@0"):
        fetch(bus, topic, [(1, 0)])
    with pytest.raises(RecordGoneError, match=r"\[7\]@0"):
        fetch(bus, topic, [(7, 0)])
    bus.close()
