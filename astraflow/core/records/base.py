"""The base of every record (its schema name and version) and the packed numeric arrays
records carry (little-endian ``<i4``, ``<f4``, ``u1`` bytes; see :mod:`astraflow.core.records`)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import msgspec

from astraflow.core.errors import SchemaError

if TYPE_CHECKING:
    import numpy as np

SCHEMA_HEADER = "af-schema"


class Record(msgspec.Struct, kw_only=True, tag_field="schema", omit_defaults=False):
    """Base of every record. ``v`` is the schema version; ``schema`` (the tag) its type name."""

    SCHEMA_VERSION: ClassVar[int] = 1
    v: int = 1

    def __post_init__(self) -> None:
        if self.v != self.SCHEMA_VERSION:
            raise SchemaError(
                f"unknown schema version {self.v} for {type(self).__name__} (this build reads "
                f"version {self.SCHEMA_VERSION}); upgrade the reader or re-produce the record"
            )

    @classmethod
    def schema_name(cls) -> str:
        return cls.__struct_config__.tag  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# packed numeric arrays
# ---------------------------------------------------------------------------------------------

_LITTLE = sys.byteorder == "little" and array("i").itemsize == array("f").itemsize == 4


def _pack_list(values: object, code: str) -> bytes | None:
    """A list packed by the stdlib ``array`` (several times cheaper than numpy on the short
    per-token lists of one episode), or None where only numpy gives the documented result
    (other iterables, a big-endian host, elements ``array`` refuses such as floats for ints)."""
    if type(values) is not list or not _LITTLE:
        return None
    try:
        return array(code, values).tobytes()
    except TypeError:
        return None


def pack_i32(values: Iterable[int] | np.ndarray) -> bytes:
    """Pack ints as little-endian int32 bytes (token ids, versions)."""
    fast = _pack_list(values, "i")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="<i4")).tobytes()


def pack_f32(values: Iterable[float] | np.ndarray) -> bytes:
    """Pack floats as little-endian float32 bytes (logprobs)."""
    fast = _pack_list(values, "f")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="<f4")).tobytes()


def pack_u8(values: Iterable[int] | np.ndarray) -> bytes:
    """Pack 0/1 flags as uint8 bytes (loss masks)."""
    fast = _pack_list(values, "B")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="u1")).tobytes()


def unpack(data: bytes, dtype: str) -> np.ndarray:
    """Read a packed array (read-only numpy view). ``dtype`` is ``"<i4"``, ``"<f4"`` or ``"u1"``."""
    import numpy as np

    if len(data) % np.dtype(dtype).itemsize:
        raise SchemaError(f"packed array of {len(data)} bytes is not a whole number of {dtype}")
    return np.frombuffer(data, dtype=dtype)
