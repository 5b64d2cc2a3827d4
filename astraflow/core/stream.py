"""Typed streams over the bus: decode with validation, dead-letter what fails, commit after
produce. This is the thin runner every consume → transform → produce component uses.

The loop of :func:`run_processor` is the at-least-once contract of DESIGN.md §4 in code:

1. consume a batch of input records;
2. decode each (a record that cannot be decoded goes to the dead-letter topic);
3. hand each to ``handle``, which returns the output records (a record whose handler raises
   goes to the dead-letter topic too, and processing goes on);
4. produce the outputs and the dead letters, and **flush** (they are durable now);
5. **commit** the inputs.

A crash anywhere before 5 redelivers the inputs; the outputs of a redelivered input may then be
produced twice, which is why downstream effects are made idempotent by record id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from astraflow.core.bus.types import Bus, Consumer, Message, Producer, RebalanceCallback
from astraflow.core.errors import BusError, CommitError, SchemaError
from astraflow.core.records import DeadLetter, Record, decode, encode, schema_header

log = logging.getLogger("astraflow.stream")

R = TypeVar("R", bound=Record)


@dataclass(frozen=True, slots=True)
class Output:
    """A record to produce to ``topic`` (key defaults to none)."""

    topic: str
    record: Record
    key: bytes | None = None


def send(producer: Producer, out: Output) -> None:
    """Produce one record with its schema header."""
    producer.produce(out.topic, encode(out.record), key=out.key, headers=[schema_header(out.record)])


def dead_letter(msg: Message, error: BaseException, *, group: str = "", component: str = ""
                ) -> DeadLetter:
    """The dead-letter record for ``msg`` that failed with ``error``."""
    return DeadLetter(
        origin=msg.origin, topic=msg.topic, partition=msg.partition, offset=msg.offset,
        key=msg.key, value=msg.value, headers=list(msg.headers),
        error=str(error), error_type=type(error).__name__, group=group, component=component,
    )


def resume_consumer(bus: Bus, group: str, topics: Sequence[str],
                    offsets: Callable[[], Mapping[tuple[str, int], int]], *,
                    client_id: str = "", session_timeout: float = 10.0,
                    on_revoke: RebalanceCallback | None = None, label: str = "") -> Consumer:
    """Join ``group`` and seek every partition it is assigned (at the join or at any later
    rebalance) to ``offsets()[partition]`` where one is known: for a processor whose
    checkpoint, not the group's committed offsets, says where reading resumes. Partitions
    assigned while the consumer is being constructed (the embedded bus does that) are sought
    once it exists. A seek that fails is logged; the caller must still skip records before
    its offset."""
    holder: list[Consumer] = []
    deferred: list[tuple[str, int]] = []

    def seek(consumer: Consumer, tp: tuple[str, int]) -> None:
        offset = offsets().get(tp)
        if offset is None:
            return
        try:
            consumer.seek(tp[0], tp[1], offset)
        except BusError as e:
            log.warning("%scould not seek %s[%d] to %d (%s); skipping records before it",
                        label, tp[0], tp[1], offset, e)

    def on_assign(pairs: list[tuple[str, int]]) -> None:
        if not holder:
            deferred.extend(pairs)
            return
        for tp in pairs:
            seek(holder[0], tp)

    consumer = bus.consumer(group, list(topics), client_id=client_id,
                            session_timeout=session_timeout, on_assign=on_assign,
                            on_revoke=on_revoke)
    holder.append(consumer)
    owned = set(consumer.assignment())
    for tp in deferred:
        if tp in owned:
            seek(consumer, tp)
    return consumer


@dataclass
class StreamStats:
    """Counters of one processor run."""

    consumed: int = 0
    produced: int = 0
    dead_lettered: int = 0
    batches: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class TypedConsumer(Generic[R]):
    """A consumer that yields decoded records of type ``kind``; undecodable records are
    dead-lettered (produced to ``dlq`` and flushed) and skipped."""

    def __init__(self, consumer: Consumer, producer: Producer, kind: type[R], *, dlq: str,
                 component: str = "") -> None:
        self.consumer = consumer
        self.producer = producer
        self.kind = kind
        self.dlq = dlq
        self.component = component
        self.stats = StreamStats()

    def consume(self, max_records: int = 500, timeout: float = 1.0
                ) -> list[tuple[Message, R]]:
        msgs = self.consumer.consume(max_records, timeout)
        out: list[tuple[Message, R]] = []
        bad = False
        for msg in msgs:
            self.stats.consumed += 1
            try:
                out.append((msg, decode(msg.value, self.kind)))  # type: ignore[arg-type]
            except SchemaError as e:
                self.to_dlq(msg, e)
                bad = True
        if bad:
            self.producer.flush()
        return out

    def to_dlq(self, msg: Message, error: BaseException) -> None:
        """Queue a dead letter for ``msg`` (the caller flushes before committing)."""
        self.stats.dead_lettered += 1
        self.stats.errors[type(error).__name__] = self.stats.errors.get(type(error).__name__, 0) + 1
        log.warning("dead-lettered record origin=%s key=%r error=%s", msg.origin, msg.key, error)
        send(self.producer, Output(self.dlq, dead_letter(msg, error, group=self.consumer.group,
                                                         component=self.component), msg.key))

    def commit(self, messages: Sequence[Message] | None = None) -> None:
        self.consumer.commit(messages)


Handler = Callable[[R, Message], Iterable[Output]]


def run_processor(bus: Bus, *, group: str, inputs: Sequence[str], kind: type[R],
                  handle: Handler[R], dlq: str, component: str = "",
                  max_records: int | None = None, timeout: float | None = None,
                  batch_size: int = 256, poll_timeout: float = 0.5,
                  session_timeout: float = 10.0,
                  should_stop: Callable[[], bool] | None = None) -> StreamStats:
    """Consume ``inputs`` as group ``group``, transform each record with ``handle``, produce
    its outputs, flush, then commit. Stops after ``max_records`` inputs, after ``timeout``
    seconds, or when ``should_stop()`` is true; whichever comes first (None: never)."""
    consumer = bus.consumer(group, inputs, client_id=component, session_timeout=session_timeout)
    producer = bus.producer(client_id=component)
    stream = TypedConsumer(consumer, producer, kind, dlq=dlq, component=component)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if should_stop is not None and should_stop():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            remaining = None if max_records is None else max_records - stream.stats.consumed
            if remaining is not None and remaining <= 0:
                break
            n = batch_size if remaining is None else min(batch_size, remaining)
            wait = poll_timeout if deadline is None else max(
                0.0, min(poll_timeout, deadline - time.monotonic()))
            before = stream.stats.consumed
            decoded = stream.consume(n, wait)
            if stream.stats.consumed == before:
                continue
            for msg, record in decoded:
                try:
                    outputs = list(handle(record, msg))
                except Exception as e:  # noqa: BLE001 - isolate one bad record, count it, go on
                    stream.to_dlq(msg, e)
                    continue
                for out in outputs:
                    send(producer, out)
                    stream.stats.produced += 1
            producer.flush()
            try:
                consumer.commit()
            except CommitError as e:
                # Our partition moved in a rebalance: its new owner redelivers these records.
                log.warning("commit refused, records will be redelivered: %s", e)
            stream.stats.batches += 1
    finally:
        producer.flush()
        producer.close()
        consumer.close()
    return stream.stats
