"""Encoding and decoding records: msgpack bytes <-> typed, validated records, and the
``af-schema`` header (see :mod:`astraflow.core.records`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import msgspec

from astraflow.core.errors import SchemaError
from astraflow.core.records.base import SCHEMA_HEADER, Record
from astraflow.core.records.control import (
    Claim,
    DeadLetter,
    LoadReport,
    Metric,
    WeightManifest,
)
from astraflow.core.records.episodes import Batch, GroupStats, Task, Trajectory, TrajectoryGroup
from astraflow.core.records.gateway import GatewayCall

SCHEMAS: dict[str, type[Record]] = {
    cls.schema_name(): cls
    for cls in (Task, Trajectory, GroupStats, TrajectoryGroup, Batch, WeightManifest, Metric,
                LoadReport, DeadLetter, Claim, GatewayCall)
}

AnyRecord = (Task | Trajectory | GroupStats | TrajectoryGroup | Batch | WeightManifest | Metric
             | LoadReport | DeadLetter | Claim | GatewayCall)

R = TypeVar("R", bound=Record)

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    dec = _decoders.get(kind)
    if dec is None:
        dec = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    return dec


def encode(record: Record) -> bytes:
    """Encode a record to msgpack bytes."""
    return _encoder.encode(record)


def schema_header(record: Record | type[Record]) -> tuple[str, bytes]:
    """The ``af-schema`` header value for a record, e.g. ``("af-schema", b"Task/1")``."""
    cls = record if isinstance(record, type) else type(record)
    return SCHEMA_HEADER, f"{cls.schema_name()}/{cls.SCHEMA_VERSION}".encode()


@overload
def decode(data: bytes, kind: type[R]) -> R: ...
@overload
def decode(data: bytes, kind: None = None) -> AnyRecord: ...


def decode(data: bytes, kind: type[R] | None = None) -> R | AnyRecord:
    """Decode and validate msgpack bytes into a record.

    ``kind`` restricts the accepted type; without it any known schema is accepted. Raises
    :class:`SchemaError` naming the record type and the offending field.
    """
    target: Any = kind if kind is not None else AnyRecord
    try:
        return _decoder(target).decode(data)
    except msgspec.ValidationError as e:
        expected = kind.schema_name() if kind is not None else "a known record"
        raise SchemaError(f"invalid {expected}: {e}") from e
    except msgspec.DecodeError as e:
        raise SchemaError(f"not a msgpack record ({e}); expected "
                          f"{kind.schema_name() if kind else 'a known record'}") from e
    except RecursionError:
        # a free-form field (Task.reference) holding arrays or maps nested past the
        # interpreter's recursion limit: a bad record like any other, not a crash of the reader
        raise SchemaError(
            f"invalid {kind.schema_name() if kind else 'a known record'}: a value nests deeper "
            f"than the decoder allows (about {sys.getrecursionlimit()} levels of arrays or maps"
            "; a free-form field such as Task.reference?); flatten it") from None


def decode_many(items: Sequence[bytes], kind: type[R]) -> list[R]:
    return [decode(b, kind) for b in items]


def to_builtins(record: Record) -> Any:
    """A JSON-friendly view of a record (bytes as base64), for ``astraflow inspect``."""
    return msgspec.to_builtins(record)
