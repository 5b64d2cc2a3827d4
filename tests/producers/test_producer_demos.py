"""SFT demonstrations go to ``batches.<policy>`` keyed as the topic table says."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from astraflow.core.bus import connect
from astraflow.core.records import Batch, decode
from astraflow.core.topics import record_key, run_topics, topic_name
from astraflow.producers.demos import produce_demos


def test_demos_are_routed_and_keyed_by_the_table(tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["solver"]))
    batches = [Batch(id=f"b{i}", policy="solver", seq=i, groups=[]) for i in range(3)]
    assert produce_demos(bus, "r", "solver", iter(batches)) == 3
    topic = topic_name("r", "batches", "solver")
    c = bus.consumer(f"read-{uuid.uuid4().hex[:6]}", [topic], start="earliest")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got.extend(c.consume(10, 0.2))
    c.close()
    assert [decode(m.value, Batch).id for m in got] == ["b0", "b1", "b2"]
    assert {m.key for m in got} == {record_key("batches", batches[0])} == {b"solver"}
    with pytest.raises(ValueError, match="demo_batches\\(policy='solver'\\)"):
        produce_demos(bus, "r", "solver", iter([Batch(id="x", policy="other", seq=0, groups=[])]))
    bus.close()
