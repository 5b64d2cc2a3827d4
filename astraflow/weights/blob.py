"""The blob format: one file per weight version, self-describing, checked on every read.

Layout (all integers little-endian)::

    0   4  magic  b"AFWB"
    4   2  format version (1)
    6   2  flags (0)
    8   4  header length H
    12  4  crc32 of the header bytes
    16  H  header: msgpack map (BlobHeader below)
    16+H   payload: each tensor's bytes at [offset, offset + length) relative to here

The header lists each tensor's name, dtype, shape, encoding, byte range and digests
(docs/weights.md); encodings are :mod:`astraflow.weights.codec`'s."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Literal

import msgspec
import numpy as np

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import Hasher, check_digest_format, digest, dtype_info
from astraflow.weights.codec import (
    DEFAULT_LEVEL,
    Encoded,
    decode_delta,
    decode_full,
    encode_delta,
    encode_full,
    full_size,
)

MAGIC = b"AFWB"
FORMAT = 1
CODEC = "afw/1"  # the manifest's codec field: blob format 1, blake3 digests
_PREFIX = struct.Struct("<4sHHII")
PREFIX_SIZE = _PREFIX.size
MAX_HEADER = 64 << 20
MAX_DIMS = 64  # numpy's limit

class BaseMismatchError(WeightIntegrityError):
    """A delta was about to be applied to a base other than the one it was made against."""


#: name → (dtype name, raw bits with the tensor's shape)
Bits = Mapping[str, tuple[str, np.ndarray]]


class BlobTensor(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    dtype: str
    shape: list[int]
    enc: Literal["raw", "zplanes", "delta"]
    offset: int  # relative to the payload start
    length: int
    digest: str  # of the tensor's bytes after applying
    base_digest: str = ""  # delta: of the base tensor's bytes
    changed: int = -1  # delta: elements changed
    gap_width: int = 0
    value_width: int = 0
    values: str = ""

    def encoded(self, payload: bytes | memoryview) -> Encoded:
        return Encoded(self.enc, payload, self.changed, self.gap_width,
                       self.value_width, self.values)

    @property
    def numel(self) -> int:
        return prod(self.shape)


class BlobHeader(msgspec.Struct, kw_only=True):
    kind: Literal["full", "delta"]
    version: int
    base_version: int | None = None
    tensors: list[BlobTensor]


@dataclass
class Blob:
    """A parsed blob: its header and the buffer it came from."""

    header: BlobHeader
    buf: bytes | memoryview
    payload_start: int

    def payload(self, t: BlobTensor) -> memoryview:
        s = self.payload_start + t.offset
        return memoryview(self.buf)[s:s + t.length]

    def tensor(self, name: str) -> BlobTensor:
        for t in self.header.tensors:
            if t.name == name:
                return t
        raise WeightIntegrityError(f"tensor {name!r} is not in this blob")

    def decode_into(self, t: BlobTensor, flat: np.ndarray) -> None:
        """Decode tensor ``t`` into flat words ``flat`` (holding the base, for a delta) and
        verify the result's digest."""
        where = self.payload_start + t.offset
        enc = t.encoded(self.payload(t))
        if t.enc == "delta":
            decode_delta(enc, flat, tensor=t.name, offset=where)
        else:
            decode_full(enc, flat, tensor=t.name, offset=where)
        got = digest(flat)
        if got != t.digest:
            raise WeightIntegrityError(
                f"tensor {t.name!r}: digest after applying is {got}, the blob says {t.digest} "
                f"(payload at blob offset {where}); the blob or the base is corrupt")


@dataclass
class EncodedVersion:
    blob: bytes
    header: BlobHeader
    payload_start: int
    digests: dict[str, str]
    dense_bytes: int


def _words(name: str, dtype: str, bits: np.ndarray) -> np.ndarray:
    info = dtype_info(dtype, tensor=name)
    if bits.dtype != info.bits or not bits.flags.c_contiguous:
        raise WeightIntegrityError(f"tensor {name!r}: expected contiguous {info.bits} words for "
                                   f"{dtype}, got {bits.dtype}")
    return bits.reshape(-1)


def check_compatible(new: Bits, base: Bits) -> None:
    """Raise naming the first tensor whose name, dtype or shape differs between the two."""
    for name in new:
        if name not in base:
            raise WeightIntegrityError(f"tensor {name!r} is in the new version, not in the base")
    for name, (dtype, bits) in base.items():
        if name not in new:
            raise WeightIntegrityError(f"tensor {name!r} is in the base, not in the new version")
        ndtype, nbits = new[name]
        if ndtype != dtype or nbits.shape != bits.shape:
            raise WeightIntegrityError(
                f"tensor {name!r}: base is {dtype}{list(bits.shape)}, new is "
                f"{ndtype}{list(nbits.shape)}")


def encode_version(new: Bits, *, version: int, base: Bits | None = None,
                   base_version: int | None = None, base_digests: Mapping[str, str] | None = None,
                   level: int = DEFAULT_LEVEL, values: str = "sub",
                   compress_full: bool = True) -> EncodedVersion:
    """Encode ``new`` as a full blob (``base`` None) or a delta against ``base``."""
    if base is not None:
        check_compatible(new, base)
    entries: list[BlobTensor] = []
    parts: list[bytes | memoryview] = []
    digests: dict[str, str] = {}
    offset = dense = 0
    for name, (dtype, bits) in new.items():
        flat = _words(name, dtype, bits)
        dense += flat.nbytes
        if base is None:
            enc = encode_full(flat, level=level, compress=compress_full)
            dig = digest(flat)
            base_dig = ""
        else:
            bflat = _words(name, dtype, base[name][1])
            h = Hasher()
            enc = encode_delta(bflat, flat, level=level, values=values, hasher=h)
            dig = h.hexdigest()
            base_dig = (base_digests or {}).get(name) or digest(bflat)
        digests[name] = dig
        entries.append(BlobTensor(
            name=name, dtype=dtype, shape=list(bits.shape), enc=enc.enc,  # type: ignore[arg-type]
            offset=offset, length=len(enc.payload), digest=dig, base_digest=base_dig,
            changed=enc.changed, gap_width=enc.gap_width, value_width=enc.value_width,
            values=enc.values))
        parts.append(enc.payload)
        offset += len(enc.payload)
    header = BlobHeader(kind="full" if base is None else "delta", version=version,
                        base_version=base_version if base is not None else None, tensors=entries)
    hbytes = msgspec.msgpack.encode(header)
    prefix = _PREFIX.pack(MAGIC, FORMAT, 0, len(hbytes), zlib.crc32(hbytes))
    blob = b"".join([prefix, hbytes, *parts])
    return EncodedVersion(blob, header, PREFIX_SIZE + len(hbytes), digests, dense)


def read_header(head: bytes | memoryview, *, source: str = "blob") -> tuple[BlobHeader, int]:
    """Parse and validate the prefix and header from the first bytes of a blob (at least
    :data:`PREFIX_SIZE` + header length). Returns the header and the payload start."""
    if len(head) < PREFIX_SIZE:
        raise WeightIntegrityError(f"{source}: {len(head)} bytes is too short for a weight blob")
    magic, fmt, _flags, hlen, crc = _PREFIX.unpack_from(head, 0)
    if magic != MAGIC:
        raise WeightIntegrityError(f"{source}: not a weight blob (magic {bytes(magic)!r}, "
                                   f"expected {MAGIC!r})")
    if fmt != FORMAT:
        raise WeightIntegrityError(f"{source}: blob format {fmt}; this build reads {FORMAT}")
    if hlen > MAX_HEADER or len(head) < PREFIX_SIZE + hlen:
        raise WeightIntegrityError(f"{source}: truncated header ({len(head) - PREFIX_SIZE} of "
                                   f"{hlen} bytes)")
    hbytes = bytes(head[PREFIX_SIZE:PREFIX_SIZE + hlen])
    if zlib.crc32(hbytes) != crc:
        raise WeightIntegrityError(f"{source}: header checksum mismatch at offset {PREFIX_SIZE}")
    try:
        header = msgspec.msgpack.decode(hbytes, type=BlobHeader)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise WeightIntegrityError(f"{source}: invalid header ({e})") from None
    _validate(header, source)
    return header, PREFIX_SIZE + hlen


def _validate(header: BlobHeader, source: str) -> None:
    seen: set[str] = set()
    for t in header.tensors:
        dtype_info(t.dtype, tensor=t.name)
        if t.name in seen:
            raise WeightIntegrityError(f"{source}: tensor {t.name!r} appears twice")
        seen.add(t.name)
        if any(d < 0 for d in t.shape) or t.offset < 0 or t.length < 0:
            raise WeightIntegrityError(f"{source}: tensor {t.name!r} has a negative size or "
                                       f"offset (shape {t.shape}, offset {t.offset})")
        if len(t.shape) > MAX_DIMS:
            raise WeightIntegrityError(f"{source}: tensor {t.name!r} has {len(t.shape)} "
                                       f"dimensions; at most {MAX_DIMS}")
        # numpy's bound, which counts the other dimensions of an empty array too
        if prod(d or 1 for d in t.shape) * dtype_info(t.dtype).bits.itemsize >= 2**63:
            raise WeightIntegrityError(f"{source}: tensor {t.name!r} has shape {t.shape}, more "
                                       "elements than an array can address")
        if (t.enc == "delta") != (header.kind == "delta"):
            raise WeightIntegrityError(f"{source}: tensor {t.name!r} has encoding {t.enc!r} "
                                       f"in a {header.kind} blob")
        check_digest_format(t.digest, tensor=t.name)
        if header.kind == "delta":
            check_digest_format(t.base_digest, tensor=t.name)


def payload_size(header: BlobHeader) -> int:
    """Bytes of payload the header's tensor ranges cover."""
    return max((t.offset + t.length for t in header.tensors), default=0)


def parse_blob(buf: bytes | memoryview, *, source: str = "blob") -> Blob:
    """Parse a whole blob; truncation is an error that says how much is missing."""
    header, start = read_header(buf, source=source)
    need = start + payload_size(header)
    if len(buf) < need:
        raise WeightIntegrityError(f"{source}: truncated: {len(buf)} bytes, the header needs "
                                   f"{need}")
    blob = Blob(header, buf, start)
    for t in header.tensors:
        # a full tensor is allocated from its shape: the shape must be what the payload holds
        # before anything is allocated (a forged header could ask for terabytes)
        if t.enc != "delta":
            want = t.numel * dtype_info(t.dtype).bits.itemsize
            got = full_size(t.encoded(blob.payload(t)), tensor=t.name, offset=start + t.offset)
            if got != want:
                raise WeightIntegrityError(
                    f"{source}: tensor {t.name!r} ({t.dtype}{t.shape}) needs {want} bytes; its "
                    f"{t.enc} payload at blob offset {start + t.offset} holds {got}")
    return blob


def check_applicable(blob: Blob, state: Bits, *, digests: Mapping[str, str] | None = None,
                     source: str = "delta") -> None:
    """Raise naming the first tensor that keeps a delta from applying to ``state``: a name,
    dtype or shape mismatch, or (when the base's ``digests`` are known) a different base."""
    if blob.header.kind != "delta":
        return
    names = {t.name for t in blob.header.tensors}
    for name in state:
        if name not in names:
            raise WeightIntegrityError(f"tensor {name!r} is in the base, not in the {source}")
    for t in blob.header.tensors:
        if t.name not in state:
            raise WeightIntegrityError(f"tensor {t.name!r} is in the {source}, not in the base")
        dtype, bits = state[t.name]
        if dtype != t.dtype or list(bits.shape) != t.shape:
            raise WeightIntegrityError(
                f"tensor {t.name!r}: base is {dtype}{list(bits.shape)}, the {source} expects "
                f"{t.dtype}{t.shape}")
        if digests is not None and digests.get(t.name) != t.base_digest:
            raise BaseMismatchError(
                f"tensor {t.name!r}: the base is not the one this {source} was made against "
                f"(base digest {digests.get(t.name)}, {source} expects {t.base_digest})")


def apply_version(blob: Blob, base: Bits | None = None, *, verify_base: bool = True
                  ) -> dict[str, tuple[str, np.ndarray]]:
    """The tensors a blob describes, as new arrays: a full blob alone, a delta applied to a copy
    of ``base`` (checked against the delta's base digests unless ``verify_base`` is false).
    Every check runs before any output exists, so an error leaves nothing half done."""
    if blob.header.kind == "delta":
        if base is None:
            raise WeightIntegrityError("a delta blob needs the base it applies to")
        digests = ({n: digest(b) for n, (_d, b) in base.items()} if verify_base else None)
        check_applicable(blob, base, digests=digests)
    out: dict[str, tuple[str, np.ndarray]] = {}
    for t in blob.header.tensors:
        info = dtype_info(t.dtype, tensor=t.name)
        if t.enc == "delta":
            assert base is not None
            arr = np.array(base[t.name][1], dtype=info.bits, order="C", copy=True)
        else:
            arr = np.empty(t.shape, dtype=info.bits)
        blob.decode_into(t, arr.reshape(-1))
        out[t.name] = (t.dtype, arr)
    return out
