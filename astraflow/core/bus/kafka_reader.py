"""The Kafka bus's group-less reader: every partition of one topic through ``assign()``.

librdkafka needs a ``group.id`` to start a consumer, but the id reaches the broker only
through ``subscribe()``, commits and committed-offset lookups. This reader does none of them:
it assigns every partition at an explicit offset with auto-commit and the offset store off,
so the fixed :data:`READER_GROUP_ID` is never joined and no offset is stored under it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from astraflow.core.bus.kafka_common import (
    _TRANSIENT,
    _UNKNOWN_TOPIC,
    ClientLog,
    ck,
    consume_many,
    kafka_error,
    poll_one,
    to_message,
    watermarks,
)
from astraflow.core.bus.reader import Bounds, offset_problem, start_offsets
from astraflow.core.bus.types import Message, ReaderStart
from astraflow.core.errors import BusError, TopicError

if TYPE_CHECKING:
    from astraflow.core.bus.kafka import KafkaBus

log = logging.getLogger("astraflow.bus.kafka")

#: The ``group.id`` librdkafka insists on; never joined, never committed to (see above).
READER_GROUP_ID = "astraflow.reader.no-group"


class KafkaReader:
    """A :class:`~astraflow.core.bus.types.Reader` of ``topic`` on Kafka."""

    def __init__(self, bus: KafkaBus, topic: str, *, start: ReaderStart,
                 client_id: str = "") -> None:
        self.topic = topic
        self.partitions = bus.partitions(topic)  # TopicError for an unknown topic
        self.client_id = client_id or "astraflow-reader"
        self._log = ClientLog(bus.bootstrap)
        self._c = ck.Consumer(bus.client_config({
            "group.id": READER_GROUP_ID,
            "client.id": self.client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Only where an offset fell below the log start (retention) since it was checked.
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }, self._log))
        self._closed = False
        try:
            # Concrete offsets, so "latest" means the end now (records produced once reader()
            # returns are delivered) and positions are known before the first record.
            self._next = start_offsets(topic, start, self._bounds(range(self.partitions)))
            self._c.assign([ck.TopicPartition(topic, p, off) for p, off in self._next.items()])
        except BaseException:
            self.close()
            raise
        log.debug("reader=%s topic=%s from %s", self.client_id, topic, self._next)

    def __repr__(self) -> str:
        return f"KafkaReader(topic={self.topic!r}, client_id={self.client_id!r})"

    def _bounds(self, partitions: range | list[int]) -> Bounds:
        out = {}
        for p in partitions:
            try:
                out[p] = watermarks(self._c, self.topic, p)
            except ck.KafkaException as e:
                raise BusError(f"reading the offsets of {self.topic}[{p}] failed: "
                               f"{kafka_error(e).str()}; is the broker running?") from e
        return out

    # ---- reading

    def _message(self, msg: Any) -> Message | None:
        err = msg.error()
        if err is not None:
            where = f"{msg.topic()}[{msg.partition()}]" if msg.topic() else self.topic
            if err.code() in _TRANSIENT or err.retriable():
                self._log.noise(f"reader {where} {err.str()}")
                return None
            if err.code() in _UNKNOWN_TOPIC:
                raise TopicError(f"reader of {where}: {err.str()}")
            raise BusError(f"reader of {where}: {err.str()}")
        self._next[msg.partition()] = msg.offset() + 1
        return to_message(msg)

    def poll(self, timeout: float = 1.0) -> Message | None:
        self._log.check("reader")
        return poll_one(self._c, self._message, timeout)

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        if max_records < 1:
            raise BusError(f"max_records must be >= 1, got {max_records}")
        self._log.check("reader")
        return consume_many(self._c, self._message, max_records, timeout)

    # ---- positions

    def position(self, partition: int) -> int:
        if partition not in self._next:
            raise BusError(f"{self.topic!r} has no partition {partition!r} (valid: "
                           f"0..{self.partitions - 1})")
        return self._next[partition]

    def seek(self, partition: int, offset: int) -> None:
        if partition not in self._next:
            raise BusError(f"cannot seek: {self.topic!r} has no partition {partition!r} "
                           f"(valid: 0..{self.partitions - 1})")
        problem = offset_problem(self.topic, partition, offset, self._bounds([partition]))
        if problem:
            raise BusError(f"cannot seek: {problem}")
        tp = ck.TopicPartition(self.topic, partition, offset)
        try:
            self._c.seek(tp)
        except ck.KafkaException as e:
            if kafka_error(e).code() != ck.KafkaError._STATE:
                raise BusError(f"seek {self.topic}[{partition}]@{offset}: "
                               f"{kafka_error(e).str()}") from e
            # Assigned but not fetching yet: seek() is refused; assigning again at the wanted
            # offsets (the others at their positions) sets where fetching starts.
            self._next[partition] = offset
            self._c.assign([ck.TopicPartition(self.topic, p, off)
                            for p, off in self._next.items()])
        self._next[partition] = offset

    def close(self) -> None:
        """Release the client; nothing on the broker changes (there is no group to leave)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._c.close()
        except ck.KafkaException as e:
            log.warning("reader of %s: closing: %s", self.topic, kafka_error(e).str())
