"""Fuzzing the typed stream (docs/results/faults.md#fuzzing): through :func:`run_processor`
on the embedded bus, a generated mix of good and bad records gives exactly the good ones as outputs and exactly the
bad ones as dead letters, each with its origin, key, error and a prefix of its value; the
processor goes on past every one of them and ends with no lag.

Bad records: any bytes, mutated encodings of a task, other record types, msgpack of the
wrong shape, values nested past the decoder's limit, claim checks the reader cannot resolve,
and tasks whose handling raises. Each example runs on fresh topics of the session's bus, so
the example count is small (see ``tests/fuzzing.py``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import msgspec
import pytest
from fuzzing import fuzz
from hypothesis import event, given
from hypothesis import strategies as st

from astraflow.core.bus import Bus, Message, connect
from astraflow.core.bus.reader import read_all
from astraflow.core.errors import SchemaError
from astraflow.core.records import (
    ChatMessage,
    Claim,
    DeadLetter,
    Metric,
    Task,
    decode,
    encode,
    schema_header,
)
from astraflow.core.stream import Output, run_processor

FAIL = "fail-"  # a task whose id starts so makes the handler raise


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    bus = connect(f"embedded://{tmp_path_factory.mktemp('fuzz-bus') / 'bus.db'}")
    yield bus
    bus.close()


def _task(i: int, fail: bool = False) -> Task:
    return Task(id=f"{FAIL if fail else ''}task-{i}", dataset="fuzz",
                prompt=[ChatMessage(role="user", content=f"{i}?")], reference={"answer": i})


@st.composite
def items(draw: st.DrawFn, i: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Record ``i`` of a mix: its value and headers (good or bad; the test's oracle decides)."""
    kind = draw(st.sampled_from(["good", "good", "good", "bytes", "flip", "cut", "other",
                                 "shape", "deep", "claim", "raises"]))
    event(f"record: {kind}")
    task = _task(i, fail=kind == "raises")
    value = encode(task)
    headers = [schema_header(task)]
    if kind == "bytes":
        value = draw(st.binary(max_size=64))
    elif kind == "flip":
        data = bytearray(value)
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        value = bytes(data)
    elif kind == "cut":
        value = value[:draw(st.integers(0, len(value) - 1))]
    elif kind == "other":
        value = encode(Metric(component=f"c{i}", role="rollout", host="h", pid=i))
    elif kind == "shape":
        plain = msgspec.msgpack.decode(value)
        plain[draw(st.sampled_from(sorted(plain)))] = draw(
            st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=4)
            | st.lists(st.integers(-5, 5), max_size=2))
        value = msgspec.msgpack.encode(plain)
    elif kind == "deep":
        value = value.replace(msgspec.msgpack.encode({"answer": i}),
                              msgspec.msgpack.encode({"answer": msgspec.Raw(b"\x91" * 3000
                                                                           + b"\xc0")}))
    elif kind == "claim":  # this reader has no claim store: the record cannot be resolved
        claim = Claim(uri=f"claims/Task/{hashlib.sha256(value).hexdigest()}.msgpack",
                      schema_of="Task", size=len(value), digest=hashlib.sha256(value).hexdigest())
        value, headers = encode(claim), [schema_header(claim)]
    return value, headers


@st.composite
def mixes(draw: st.DrawFn) -> tuple[int, int, list[tuple[bytes, list[tuple[str, bytes]]]]]:
    """(partitions, records per poll, the records)."""
    n = draw(st.integers(1, 12))
    return (draw(st.integers(1, 3)), draw(st.sampled_from([1, 3, 256])),
            [draw(items(i)) for i in range(n)])


def _expected_good(value: bytes, headers: list[tuple[str, bytes]]) -> str | None:
    """The oracle: the task id a record yields, or None when it must be dead-lettered."""
    if dict(headers).get("af-schema", b"").startswith(b"Claim/"):
        return None
    try:
        task = decode(value, Task)
    except SchemaError:
        return None
    assert isinstance(task, Task)
    return None if task.id.startswith(FAIL) else task.id


@fuzz(50)
@given(mixes())
def test_bad_records_go_to_the_dead_letter_topic_and_processing_goes_on(
        embedded: Bus, mix: tuple[int, int, list[tuple[bytes, list[tuple[str, bytes]]]]]
) -> None:
    partitions, batch, records = mix
    run = uuid.uuid4().hex[:10]
    src, dst, dlq, group = f"src-{run}", f"dst-{run}", f"dlq-{run}", f"g-{run}"
    embedded.create_topics({src: partitions, dst: 1, dlq: 1})
    p = embedded.producer()
    for i, (value, headers) in enumerate(records):
        p.produce(src, value, key=f"k{i}".encode(), headers=headers)
    p.flush()
    p.close()

    def handle(task: Task, _msg: Message) -> list[Output]:
        if task.id.startswith(FAIL):
            raise RuntimeError(f"handler failed on {task.id}")
        return [Output(dst, task, task.id.encode())]

    stats = run_processor(embedded, group=group, inputs=[src], kind=Task, handle=handle,
                          dlq=dlq, component="fuzz", max_records=len(records), timeout=60,
                          batch_size=batch, poll_timeout=0.05)

    sent = {m.key: m for m in read_all(embedded, src)}
    good = {key: _expected_good(m.value, m.headers) for key, m in sent.items()}
    outputs = sorted(decode(m.value, Task).id for m in read_all(embedded, dst))  # type: ignore[union-attr]
    letters = [decode(m.value, DeadLetter) for m in read_all(embedded, dlq)]
    assert outputs == sorted(t for t in good.values() if t is not None)
    bad = {key for key, t in good.items() if t is None}
    assert sorted(d.key for d in letters) == sorted(bad)  # type: ignore[union-attr, type-var]
    for d in letters:
        assert isinstance(d, DeadLetter)
        m = sent[d.key]
        assert (d.origin, d.topic, d.partition, d.offset) == (
            m.origin, m.topic, m.partition, m.offset)
        assert d.value == m.value and d.value_size == len(m.value)
        assert d.value_digest == hashlib.sha256(m.value).hexdigest()
        assert d.error and d.error_type in ("SchemaError", "RuntimeError"), d.error_type
        assert d.group == group and d.component == "fuzz"
    assert (stats.consumed, stats.dead_lettered) == (len(records), len(bad))
    assert sum(embedded.lag(group, src).values()) == 0, "the processor went on to the end"
