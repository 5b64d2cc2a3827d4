"""The bus protocol: the one narrow interface every component uses (docs/reference/bus.md).

Both backends (``embedded`` and ``kafka``) pass one conformance suite
(``tests/core/test_bus_conformance.py``): per-partition order and stable key → partition;
at-least-once delivery from committed offsets; :meth:`Producer.flush` returns once everything
before it is durable; :meth:`Consumer.commit` raises
:class:`~astraflow.core.errors.CommitError` naming only lost partitions; a :class:`Reader`
reads a topic without a group and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

Headers = list[tuple[str, bytes]]

#: Records larger than this are refused by default (Kafka's default client limit).
DEFAULT_MAX_MESSAGE_BYTES = 1_000_000


@dataclass(frozen=True, slots=True)
class Message:
    """One record as read from the bus."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers = field(default_factory=list)
    timestamp: float = 0.0  # seconds since the epoch, set when produced

    @property
    def origin(self) -> str:
        """``topic[partition]@offset``, the address used in errors and dead letters."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    end_offsets: dict[int, int]  # next offset to be written, per partition


#: Called with the (topic, partition) pairs a consumer gains or loses in a rebalance.
RebalanceCallback = Callable[[list[tuple[str, int]]], None]


@runtime_checkable
class Producer(Protocol):
    def produce(self, topic: str, value: bytes, *, key: bytes | None = None,
                headers: Headers | None = None, partition: int | None = None) -> None:
        """Queue a record. Raises RecordTooLargeError / TopicError at once where it can."""

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued record is durable; raise BusError if any failed."""

    def close(self) -> None: ...


@runtime_checkable
class Consumer(Protocol):
    group: str
    member_id: str

    def poll(self, timeout: float = 1.0) -> Message | None:
        """The next record of an assigned partition, or None after ``timeout`` seconds."""

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Up to ``max_records`` records; returns as soon as at least one is available."""

    def commit(self, messages: Message | Sequence[Message] | None = None) -> None:
        """Synchronously commit: for each partition, the offset after the newest given message
        (or, with None, after the newest record delivered so far).

        Partial by partition: every partition this member owns now is committed, then
        CommitError names the ones it does not own, whose records will be delivered again
        (at-least-once: a rebalance or an expired session moved them). With None, "does not
        own" means: records were delivered from the partition, then it was revoked or lost
        before they were committed and it has not come back to this member. A partition that
        was lost and came back is not an error: its uncommitted records are delivered to this
        member again from the committed offset, and what is delivered after its return is
        committed as usual. Any other failure (broker unreachable past the retry deadline)
        raises BusError and commits nothing."""

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member owns now."""

    def position(self, topic: str, partition: int) -> int | None:
        """The offset of the next record this member would deliver from that partition."""

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Deliver from ``offset`` next (an assigned partition only)."""

    def close(self) -> None:
        """Leave the group (its partitions move to the others at once) and release resources."""


#: Where a :class:`Reader` starts: "earliest", "latest", or an offset per partition.
ReaderStart = str | Mapping[int, int]


@runtime_checkable
class Reader(Protocol):
    """Reads every partition of one topic without joining a consumer group.

    For followers of a whole topic (the weight syncer, the metrics collector, accounting,
    ``astraflow inspect``): nothing is shared with other readers, nothing is committed, and no
    group, member or offset is created on the bus, so a reader leaves no trace when it closes
    or dies. Its positions live only in the reader; a restarted reader starts again from its
    ``start``. Records come in order within each partition; partitions added to the topic after
    the reader was made are not read. Not for concurrent use from several threads.
    """

    topic: str
    partitions: int

    def poll(self, timeout: float = 1.0) -> Message | None:
        """The next record of any partition, or None after ``timeout`` seconds."""

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        """Up to ``max_records`` records; returns as soon as at least one is available."""

    def position(self, partition: int) -> int:
        """The offset of the next record this reader delivers from ``partition``."""

    def seek(self, partition: int, offset: int) -> None:
        """Deliver ``partition`` from ``offset`` next (0 <= offset <= the partition's end)."""

    def close(self) -> None:
        """Release the reader's connections. Idempotent."""


@runtime_checkable
class Bus(Protocol):
    url: str
    max_message_bytes: int

    def create_topics(self, topics: dict[str, int], *, exist_ok: bool = True) -> None:
        """Create topics with the given partition counts. An existing topic with another
        partition count raises TopicError."""

    def list_topics(self) -> dict[str, int]:
        """Every topic and its partition count."""

    def describe_topic(self, name: str) -> TopicInfo: ...

    def delete_topics(self, names: Sequence[str]) -> None: ...

    def producer(self, *, client_id: str = "") -> Producer: ...

    def consumer(self, group: str, topics: Sequence[str], *, client_id: str = "",
                 start: str = "earliest", session_timeout: float = 10.0,
                 on_assign: RebalanceCallback | None = None,
                 on_revoke: RebalanceCallback | None = None) -> Consumer:
        """Join consumer group ``group`` on ``topics``. ``start`` ("earliest" | "latest") is
        where a partition with no committed offset starts. A member that stops heartbeating
        for ``session_timeout`` seconds is removed and its partitions move to the others."""

    def reader(self, topic: str, *, start: ReaderStart = "earliest",
               client_id: str = "") -> Reader:
        """A :class:`Reader` of every partition of ``topic``, joining no group. ``start`` is
        "earliest" (the first record still on the bus), "latest" (the end of each partition as
        of this call: records produced once ``reader`` returns are delivered) or a mapping of
        partition to the offset to read first (0 <= offset <= the partition's end; partitions
        it leaves out start at the earliest). An unknown topic raises TopicError, a bad
        ``start`` BusError."""

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offset per partition (absent: nothing committed)."""

    def lag(self, group: str, topic: str) -> dict[int, int]:
        """Records not yet committed by ``group``, per partition."""

    def close(self) -> None: ...
