"""Claim checks: records too large for the bus travel as a reference (docs/config.md#busclaims).

A record over the bus's message limit is put in a blob store (any object with ``put`` and
``read``, such as a weight store) under a content-addressed path, and a small
:class:`~astraflow.core.records.Claim` is produced in its place. Readers resolve claims and
check size and digest; the processor runtime and the trainer's fetch do this, so handlers
never see one.

>>> value, headers = encode_for_bus(record, limit=bus.max_message_bytes, store=store)
>>> msg = unclaim(msg, store)        # the original record's bytes, checked"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol

from astraflow.core.bus.types import Headers, Message
from astraflow.core.errors import AstraflowError, SchemaError
from astraflow.core.records import (
    SCHEMA_HEADER,
    SCHEMAS,
    Claim,
    Record,
    decode,
    encode,
    schema_header,
)

#: bytes kept free for the key, headers and the broker's framing
OVERHEAD = 512


class BlobStore(Protocol):
    """Where claimed bytes live (the weight stores satisfy it)."""

    def put(self, path: str, data: bytes | memoryview) -> None: ...

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes: ...


def fits(value: bytes, key: bytes | None, limit: int) -> bool:
    """Whether a record of ``value`` bytes with ``key`` fits a bus with message ``limit``."""
    return len(value) + len(key or b"") + OVERHEAD <= limit


def encode_for_bus(record: Record, *, limit: int, store: BlobStore | None,
                   key: bytes | None = None) -> tuple[bytes, Headers]:
    """The bytes and headers to produce for ``record``: itself where it fits ``limit``,
    otherwise a claim (its bytes put in ``store`` first). Without a store an oversized
    record is returned as it is, and the producer refuses it (RecordTooLargeError)."""
    value = encode(record)
    if store is None or fits(value, key, limit):
        return value, [schema_header(record)]
    digest = hashlib.sha256(value).hexdigest()
    uri = f"claims/{record.schema_name()}/{digest}.msgpack"
    store.put(uri, value)
    c = Claim(uri=uri, schema_of=record.schema_name(), size=len(value), digest=digest)
    return encode(c), [schema_header(c)]


def is_claim(msg: Message) -> bool:
    header = msg.header(SCHEMA_HEADER)
    return header is not None and header.startswith(b"Claim/")


def unclaim(msg: Message, store: BlobStore | None) -> Message:
    """``msg`` itself, or — for a claim — a copy carrying the claimed record's bytes and
    schema header. Raises SchemaError (the record cannot be processed: dead-letter it) when
    there is no store, the blob is missing, or its bytes do not match the claim."""
    if not is_claim(msg):
        return msg
    c: Claim = decode(msg.value, Claim)
    if store is None:
        raise SchemaError(f"{msg.origin} is a claim check for {c.uri} but this reader has no "
                          "claim store configured (bus.claims)")
    try:
        value = store.read(c.uri)
    except (AstraflowError, OSError) as e:
        raise SchemaError(f"{msg.origin}: claimed {c.schema_of} at {c.uri} cannot be read: "
                          f"{e}") from e
    if len(value) != c.size or hashlib.sha256(value).hexdigest() != c.digest:
        raise SchemaError(f"{msg.origin}: claimed {c.schema_of} at {c.uri} does not match its "
                          f"claim ({len(value)} bytes, expected {c.size} with sha256 "
                          f"{c.digest[:12]}…)")
    headers = [(k, v) for k, v in msg.headers if k != SCHEMA_HEADER]
    kind = SCHEMAS.get(c.schema_of)
    if kind is not None:
        headers.append(schema_header(kind))
    return dataclasses.replace(msg, value=value, headers=headers)
