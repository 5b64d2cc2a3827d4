"""The bus protocol: the one narrow interface every component uses (DESIGN.md §4).

Two backends implement it (``embedded`` and ``kafka``), and one conformance suite
(``tests/core/test_bus_conformance.py``) holds both to the same semantics:

* per-partition order; a key always maps to the same partition (Kafka's murmur2 on both);
* at-least-once: a consumer resumes from its group's committed offsets, and records delivered
  but not committed are delivered again after a crash or a rebalance;
* :meth:`Producer.flush` returns only when every record produced before it is durable, so a
  consumer that flushes its outputs before :meth:`Consumer.commit` never loses work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        (or, with None, after the newest record delivered so far). Raises CommitError when a
        partition is no longer assigned to this member."""

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member owns now."""

    def position(self, topic: str, partition: int) -> int | None:
        """The offset of the next record this member would deliver from that partition."""

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Deliver from ``offset`` next (an assigned partition only)."""

    def close(self) -> None:
        """Leave the group (its partitions move to the others at once) and release resources."""


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

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offset per partition (absent: nothing committed)."""

    def lag(self, group: str, topic: str) -> dict[int, int]:
        """Records not yet committed by ``group``, per partition."""

    def close(self) -> None: ...
