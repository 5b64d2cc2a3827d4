"""What a role produces: an :class:`Output` (a record for a topic), :func:`send` (produce it,
by claim check when it is too large), :class:`OutRecord` (an encoded output waiting in an
outbox) and dead letters (:class:`DeadLetters`: the one way every role dead-letters a record).
The runtime (:mod:`astraflow.core.stream`) re-exports them."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import msgspec

from astraflow.core.bus.types import DEFAULT_MAX_MESSAGE_BYTES, Message, Producer
from astraflow.core.claims import BlobStore, encode_for_bus
from astraflow.core.records import DeadLetter, Record, encode, schema_header

log = logging.getLogger("astraflow.stream")


@dataclass(frozen=True, slots=True)
class Output:
    """A record to produce to ``topic`` (key defaults to none; ``partition`` none: the
    key's partition, as every backend hashes it)."""

    topic: str
    record: Record
    key: bytes | None = None
    partition: int | None = None


def send(producer: Producer, out: Output, *, claims: BlobStore | None = None,
         limit: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
    """Produce one record with its schema header; with a claim store, a record over
    ``limit`` goes by claim check (:mod:`astraflow.core.claims`)."""
    if claims is None:
        producer.produce(out.topic, encode(out.record), key=out.key,
                         headers=[schema_header(out.record)], partition=out.partition)
        return
    value, headers = encode_for_bus(out.record, limit=limit, store=claims, key=out.key)
    producer.produce(out.topic, value, key=out.key, headers=headers, partition=out.partition)


class OutRecord(msgspec.Struct, array_like=True):
    """One encoded output waiting in an outbox: where it goes and its bytes."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = []
    partition: int | None = None  # absent (older checkpoints): the key's partition


#: what a dead letter keeps of the bad record: a letter must fit the bus even when the record
#: it reports was close to the size limit (a letter that does not fit fails to produce, and
#: again after every restart: the partition would be stuck behind it)
DLQ_VALUE_BYTES = 64 * 1024
DLQ_HEADER_BYTES = 16 * 1024
DLQ_TEXT_CHARS = 4096


def _cut(text: str, limit: int = DLQ_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more]"


def dead_letter(msg: Message, error: BaseException, *, group: str = "", component: str = ""
                ) -> DeadLetter:
    """The dead-letter record for ``msg`` that failed with ``error``: its value's first
    :data:`DLQ_VALUE_BYTES` with the whole value's size and sha256, headers while they fit
    :data:`DLQ_HEADER_BYTES`, the key and error cut to :data:`DLQ_TEXT_CHARS`."""
    value = msg.value or b""
    headers, room = [], DLQ_HEADER_BYTES
    for name, v in msg.headers:
        room -= len(name) + len(v)
        if room < 0:
            break
        headers.append((name, v))
    key = msg.key if msg.key is None or len(msg.key) <= DLQ_TEXT_CHARS else msg.key[:DLQ_TEXT_CHARS]
    return DeadLetter(
        origin=msg.origin, topic=msg.topic, partition=msg.partition, offset=msg.offset,
        key=key, value=value[:DLQ_VALUE_BYTES], value_size=len(value),
        value_digest=hashlib.sha256(value).hexdigest(), headers=headers,
        error=_cut(str(error)), error_type=type(error).__name__, group=group,
        component=component,
    )


class DeadLetters:
    """Builds, counts and logs dead letters: the one way every role dead-letters a record.
    The caller produces the returned :class:`Output` (and flushes before committing)."""

    def __init__(self, dlq: str, *, component: str = "", label: str = "") -> None:
        self.dlq = dlq
        self.component = component
        self.label = label
        self.count = 0
        self.errors: dict[str, int] = {}

    def letter(self, msg: Message, error: BaseException, *, group: str = "") -> Output:
        self.count += 1
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1
        letter = dead_letter(msg, error, group=group, component=self.component)
        log.warning("%sdead-lettered origin=%s key=%r size=%d error=%s", self.label, msg.origin,
                    letter.key, letter.value_size, letter.error)
        return Output(self.dlq, letter, letter.key)
