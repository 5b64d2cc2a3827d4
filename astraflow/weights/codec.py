"""The per-tensor codec: raw bits in, compressed bytes out, bit-exact back (numpy + zstd only).

Encodings: ``delta`` (the changed positions and their difference to the base's bits),
``zplanes`` (a full tensor as byte planes through zstd) and ``raw`` (little-endian words, when
zplanes would not save 5%); docs/weights.md#the-codec has the format and why. Every decoder
validates sizes before it allocates and raises
:class:`~astraflow.core.errors.WeightIntegrityError` naming the tensor."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import Hasher

#: zstd level: 1 is the smallest *and* fastest on delta streams
#: (docs/weights.md#why-these-encodings).
DEFAULT_LEVEL = 1
GAP_SHIFT = 4  # low bits of each gap stored packed, the rest as byte planes
_SCAN_CHUNK = 1 << 18  # elements compared per step: keeps the mask and both inputs in cache
_local = threading.local()


def _cctx(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] = _local.__dict__.setdefault("c", {})
    if level not in cache:
        # threads=0: one core; the checksum gives a precise error on a bit flip
        cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=0)
    return cache[level]


def _dctx() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "d"):
        _local.d = zstandard.ZstdDecompressor()
    return _local.d


@dataclass(frozen=True)
class Encoded:
    """One tensor's encoding: the payload bytes and what a decoder needs besides them."""

    enc: str  # "delta" | "zplanes" | "raw"
    payload: bytes | memoryview
    changed: int = -1  # delta: number of changed elements; full: -1
    gap_width: int = 0  # delta: bytes per gap (planes stored)
    value_width: int = 0  # delta: bytes per value (planes stored)
    values: str = ""  # delta: "sub" | "raw"


def width_of(max_value: int) -> int:
    """Bytes needed to hold ``max_value`` (at least 1)."""
    return max(1, (int(max_value).bit_length() + 7) // 8)


def to_planes(words: np.ndarray, width: int) -> np.ndarray:
    """Byte planes of unsigned ``words``: all byte 0s, then all byte 1s, ... (``width`` planes).
    Shifts on whole arrays: 4x faster than a strided transpose of the byte view."""
    out = np.empty((width, len(words)), dtype=np.uint8)
    for j in range(width):
        out[j] = (words >> (8 * j)) if j else words  # truncating store keeps the low byte
    return out.reshape(-1)


def from_planes(planes: np.ndarray, count: int, width: int, dtype: np.dtype[Any]) -> np.ndarray:
    """Inverse of :func:`to_planes`: ``count`` words of ``dtype`` from ``width`` byte planes
    (width 0: all zero)."""
    if width == 0:
        return np.zeros(count, dtype=dtype)
    rows = planes.reshape(width, count)
    out = rows[0].astype(dtype)
    for j in range(1, width):
        plane = rows[j].astype(dtype)
        plane <<= 8 * j
        out |= plane
    return out


def _fail(tensor: str, offset: int, what: str) -> WeightIntegrityError:
    return WeightIntegrityError(f"tensor {tensor!r} at blob offset {offset}: {what}")


# ---------------------------------------------------------------------------------------------
# delta
# ---------------------------------------------------------------------------------------------

def scan(base: np.ndarray, new: np.ndarray, hasher: Hasher | None = None, values: str = "sub"
         ) -> tuple[np.ndarray, np.ndarray]:
    """Flat int64 positions where the words of ``base`` and ``new`` differ, and the value
    stream for them (``sub``: zigzag of new - base; ``raw``: the new words). One pass in
    cache-sized chunks: the compare, the gathers and feeding ``new`` to ``hasher``."""
    n = len(new)
    mask = np.empty(min(n, _SCAN_CHUNK), dtype=bool)
    pos: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for s in range(0, n, _SCAN_CHUNK):
        e = min(n, s + _SCAN_CHUNK)
        b, c = base[s:e], new[s:e]
        m = mask[:e - s]
        np.not_equal(b, c, out=m)
        nz = np.flatnonzero(m)
        if len(nz):
            pos.append(nz + s)
            vals.append(zigzag(c[nz] - b[nz]) if values == "sub" else c[nz])
        if hasher is not None:
            hasher.update(c)
    if hasher is not None and n == 0:
        hasher.update(new)
    if not pos:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=new.dtype)
    return np.concatenate(pos), np.concatenate(vals)


def changed_positions(base: np.ndarray, new: np.ndarray, hasher: Hasher | None = None
                      ) -> np.ndarray:
    """Flat int64 positions where the words of ``base`` and ``new`` differ."""
    return scan(base, new, hasher, "raw")[0]


def zigzag(diff: np.ndarray) -> np.ndarray:
    """Map wrapped differences (unsigned words) to small unsigned codes: 0,-1,1,-2 → 0,1,2,3."""
    signed = diff.view(diff.dtype.str.replace("u", "i"))
    top = diff.itemsize * 8 - 1
    return ((signed << 1) ^ (signed >> top)).view(diff.dtype)


def unzigzag(code: np.ndarray) -> np.ndarray:
    return (code >> 1) ^ np.negative(code & 1)


def pack_bits(symbols: np.ndarray, bits: int) -> np.ndarray:
    """Pack small unsigned symbols (< 2**bits; bits 2 or 4) into bytes, first symbol lowest."""
    per = 8 // bits
    padded = np.zeros(-(-len(symbols) // per) * per, dtype=np.uint8)
    padded[:len(symbols)] = symbols
    cols = padded.reshape(-1, per)
    out = cols[:, 0].copy()
    for j in range(1, per):
        out |= cols[:, j] << (bits * j)
    return out


def unpack_bits(data: np.ndarray, count: int, bits: int) -> np.ndarray:
    per = 8 // bits
    out = np.empty((len(data), per), dtype=np.uint8)
    for j in range(per):
        out[:, j] = (data >> (bits * j)) & ((1 << bits) - 1)
    return out.reshape(-1)[:count]


def _planes_or_empty(words: np.ndarray, width: int) -> np.ndarray:
    return to_planes(words, width) if width else np.zeros(0, dtype=np.uint8)


def _width0(max_value: int) -> int:
    return 0 if max_value == 0 else width_of(max_value)


def encode_delta(base: np.ndarray, new: np.ndarray, *, level: int = DEFAULT_LEVEL,
                 values: str = "sub", hasher: Hasher | None = None) -> Encoded:
    """Encode the change from flat ``base`` to flat ``new`` (same unsigned dtype and length).

    Body (one zstd frame): the low 4 bits of each gap packed two per byte (near-uniform bits:
    stored, not modelled), the rest of each gap as ``gap_width`` byte planes; then for
    ``sub`` the zigzag codes 1, 2, 3 as 2-bit symbols 0, 1, 2 packed four per byte, symbol 3
    escaping to ``code - 4`` in ``value_width`` byte planes; for ``raw`` the new words in
    ``value_width`` byte planes. Packing first lets zstd's byte-wise Huffman coder model pairs
    and quadruples of symbols; with each stream in blocks of its own this is 10.0 bits per
    change at 98.9% unchanged, against 11.5 for plain byte planes of gaps and codes."""
    if values not in ("sub", "raw"):
        raise ValueError(f"unknown value coding {values!r}; valid: sub, raw")
    idx, vals = scan(base, new, hasher, values)
    k = len(idx)
    if k == 0:
        return Encoded("delta", b"", 0, 0, 0, values)
    gaps = (np.diff(idx, prepend=-1) - 1).astype(np.uint64)
    high = gaps >> np.uint64(GAP_SHIFT)
    gw = _width0(int(high.max()))
    parts = [pack_bits((gaps & np.uint64(15)).astype(np.uint8), 4), _planes_or_empty(high, gw)]
    if values == "sub":
        code = vals - vals.dtype.type(1)  # zigzag codes of real changes are >= 1
        parts.append(pack_bits(np.minimum(code, 3).astype(np.uint8), 2))
        escaped = code[code >= 3] - code.dtype.type(3)
        vw = _width0(int(escaped.max())) if len(escaped) else 0
        parts.append(_planes_or_empty(escaped, vw))
    else:
        vw = _width0(int(vals.max()))
        parts.append(_planes_or_empty(vals, vw))
    return Encoded("delta", _compress_streams(parts, level), k, gw, vw, values)


def _compress_streams(parts: list[np.ndarray], level: int) -> bytes:
    """One zstd frame, each stream starting a new block: a block mixing two streams gets one
    Huffman table for both, which costs size (docs/weights.md#why-these-encodings)."""
    cobj = _cctx(level).compressobj(size=sum(p.nbytes for p in parts))
    out = [cobj.compress(p.data) + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) for p in parts
           if len(p)]
    out.append(cobj.flush())
    return b"".join(out)


def _decompress(enc: Encoded, lo: int, hi: int, tensor: str, offset: int) -> np.ndarray:
    try:
        size = zstandard.frame_content_size(enc.payload)
        if not lo <= size <= hi:
            raise _fail(tensor, offset, f"payload declares {size} bytes, expected "
                        f"{lo if lo == hi else f'{lo} to {hi}'}")
        body = np.frombuffer(_dctx().decompress(enc.payload, max_output_size=hi), np.uint8)
    except zstandard.ZstdError as e:
        raise _fail(tensor, offset, f"corrupt or truncated payload ({e})") from None
    if len(body) != size:
        raise _fail(tensor, offset, f"payload holds {len(body)} bytes, declares {size}")
    return body


def decode_delta(enc: Encoded, target: np.ndarray, *, tensor: str = "", offset: int = 0) -> int:
    """Apply a delta in place to flat ``target`` (which holds the base). Returns elements changed.

    Everything is validated before ``target`` is touched, so a corrupt payload leaves it as
    it was."""
    k, gw, vw = enc.changed, enc.gap_width, enc.value_width
    n = len(target)
    if k == 0:
        if len(enc.payload):
            raise _fail(tensor, offset, f"{len(enc.payload)} payload bytes for 0 changes")
        return 0
    if not (0 < k <= n and 0 <= gw <= 8 and 0 <= vw <= target.itemsize
            and enc.values in ("sub", "raw")):
        raise _fail(tensor, offset, f"bad delta parameters changed={k} gap_width={gw} "
                    f"value_width={vw} values={enc.values!r} for {n} elements")
    n_gaps = -(-k // 2) + k * gw
    n_sym = -(-k // 4) if enc.values == "sub" else 0
    fixed = n_gaps + n_sym + (0 if enc.values == "sub" else k * vw)
    body = _decompress(enc, fixed, fixed + (k * vw if enc.values == "sub" else 0), tensor, offset)
    gaps = from_planes(body[-(-k // 2):n_gaps], k, gw, np.dtype("<u8")) << np.uint64(GAP_SHIFT)
    gaps |= unpack_bits(body[:-(-k // 2)], k, 4)
    if float(gaps.sum(dtype=np.float64)) + k > n:
        raise _fail(tensor, offset, f"changed positions run past the {n} elements")
    idx = np.cumsum(gaps + np.uint64(1), dtype=np.uint64).astype(np.int64) - 1
    if idx[-1] >= n:
        raise _fail(tensor, offset, f"changed position {idx[-1]} outside {n} elements")
    if enc.values == "raw":
        target[idx] = from_planes(body[n_gaps:], k, vw, target.dtype)
        return k
    sym = unpack_bits(body[n_gaps:n_gaps + n_sym], k, 2)
    code = sym.astype(target.dtype)
    escaped = np.flatnonzero(sym == 3)
    rest = body[n_gaps + n_sym:]
    if len(rest) != len(escaped) * vw:
        raise _fail(tensor, offset, f"{len(rest)} escape bytes for {len(escaped)} escapes of "
                    f"{vw} bytes")
    code[escaped] += from_planes(rest, len(escaped), vw, target.dtype)
    code += target.dtype.type(1)
    target[idx] = target[idx] + unzigzag(code)
    return k


# ---------------------------------------------------------------------------------------------
# full
# ---------------------------------------------------------------------------------------------

def encode_full(words: np.ndarray, *, level: int = DEFAULT_LEVEL, compress: bool = True
                ) -> Encoded:
    """Encode a whole flat tensor: byte planes + zstd, or raw when that saves under 5%."""
    raw_size = words.nbytes
    if compress and raw_size >= 64:
        cobj = _cctx(level).compressobj(size=raw_size)
        parts = [cobj.compress(to_planes(words >> (8 * j), 1).data)
                 for j in range(words.itemsize)]
        parts.append(cobj.flush())
        payload = b"".join(parts)
        if len(payload) < 0.95 * raw_size:
            return Encoded("zplanes", payload)
    return Encoded("raw", words.tobytes())


#: the most a zstd frame expands: a block holds at most 128 KiB and costs at least 4 bytes
#: (an RLE block), so a payload declaring more than this many times its size is forged
MAX_EXPANSION = (128 << 10) // 4


def full_size(enc: Encoded, *, tensor: str = "", offset: int = 0) -> int:
    """The bytes a full encoding decodes to, read without decoding: a raw payload's length, a
    zplanes frame's declared size. Refused (WeightIntegrityError) when the frame declares no
    size or more than its payload could expand to, so a caller can check a tensor's shape
    against it before it allocates anything."""
    if enc.enc == "raw":
        return len(enc.payload)
    if enc.enc != "zplanes":
        raise _fail(tensor, offset, f"unknown full encoding {enc.enc!r}; valid: raw, zplanes")
    try:
        size = zstandard.frame_content_size(enc.payload)
    except zstandard.ZstdError as e:
        raise _fail(tensor, offset, f"corrupt or truncated payload ({e})") from None
    if size < 0:
        raise _fail(tensor, offset, "the payload's zstd frame does not declare its size")
    if size > MAX_EXPANSION * len(enc.payload):
        raise _fail(tensor, offset, f"payload of {len(enc.payload)} bytes declares {size} bytes, "
                    f"more than zstd can expand it to ({MAX_EXPANSION}x)")
    return int(size)


def decode_full(enc: Encoded, out: np.ndarray, *, tensor: str = "", offset: int = 0) -> None:
    """Decode a full tensor into flat ``out`` (its length and dtype say what to expect)."""
    want = out.nbytes
    if enc.enc == "raw":
        if len(enc.payload) != want:
            raise _fail(tensor, offset, f"raw payload of {len(enc.payload)} bytes, expected {want}")
        out[:] = np.frombuffer(enc.payload, dtype=out.dtype)
        return
    if enc.enc != "zplanes":
        raise _fail(tensor, offset, f"unknown full encoding {enc.enc!r}; valid: raw, zplanes")
    try:
        size = zstandard.frame_content_size(enc.payload)
        if size != want:
            raise _fail(tensor, offset, f"payload declares {size} bytes, expected {want}")
        body = np.frombuffer(_dctx().decompress(enc.payload, max_output_size=want), np.uint8)
    except zstandard.ZstdError as e:
        raise _fail(tensor, offset, f"corrupt or truncated payload ({e})") from None
    if len(body) != want:
        raise _fail(tensor, offset, f"payload holds {len(body)} bytes, expected {want}")
    out[:] = from_planes(body, len(out), out.itemsize, out.dtype)
