"""Fuzzing the weight decoders and the blob path rule (docs/results/faults.md#fuzzing).

* the blob parser (``read_header``, ``parse_blob``, ``apply_version``), the codec's decoders
  (``decode_full``, ``decode_delta``) and the safetensors reader: any bytes give a result or a
  WeightIntegrityError, never another exception (an oversized allocation, a ValueError of
  numpy, a TypeError of a malformed header...); a delta that is refused leaves its target as
  it was;
* ``check_path``: any string is accepted exactly when an independent statement of the
  documented rule accepts it, and refused with UnsafePathError otherwise.

Settings (cases per target, the long profile) are in ``tests/fuzzing.py``.
"""

from __future__ import annotations

import json
import string
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import zstandard
from fuzzing import fuzz
from hypothesis import event, example, given
from hypothesis import strategies as st

from astraflow.core.errors import WeightIntegrityError, WeightStoreError
from astraflow.weights.bits import DTYPES
from astraflow.weights.blob import (
    FORMAT,
    MAGIC,
    apply_version,
    encode_version,
    parse_blob,
    read_header,
)
from astraflow.weights.codec import Encoded, decode_delta, decode_full
from astraflow.weights.safetensors_io import read_safetensors, write_safetensors
from astraflow.weights.store import MAX_PATH, UnsafePathError, check_path

Bits = dict[str, tuple[str, np.ndarray]]
WORD = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}


def _model(seed: int) -> Bits:
    rng = np.random.default_rng(seed)
    shapes = {"embed": (8, 4), "norm": (4,), "head": (3, 5)}
    dtypes = {"embed": "bfloat16", "norm": "float32", "head": "float16"}
    return {n: (dtypes[n], rng.integers(0, 1 << 12, size=s).astype(WORD[dtypes[n]]))
            for n, s in shapes.items()}


def _step(model: Bits, seed: int) -> Bits:
    rng = np.random.default_rng(seed)
    out = {}
    for n, (d, b) in model.items():
        new = b.copy().reshape(-1)
        idx = rng.choice(len(new), size=max(1, len(new) // 5), replace=False)
        new[idx] += rng.integers(1, 300, size=len(idx)).astype(new.dtype)
        out[n] = (d, new.reshape(b.shape))
    return out


BASE = _model(0)
NEW = _step(BASE, 1)
FULL = encode_version(BASE, version=0).blob
FULL_RAW = encode_version(BASE, version=0, compress_full=False).blob
DELTA = encode_version(NEW, version=1, base=BASE, base_version=0).blob
DELTA_RAW = encode_version(NEW, version=1, base=BASE, base_version=0, values="raw").blob
VALID = {"full": FULL, "full_raw": FULL_RAW, "delta": DELTA, "delta_raw": DELTA_RAW}


def _same(a: Bits, b: Bits) -> bool:
    return a.keys() == b.keys() and all(
        a[n][0] == b[n][0] and a[n][1].shape == b[n][1].shape
        and a[n][1].tobytes() == b[n][1].tobytes() for n in a)


def test_the_valid_blobs_apply() -> None:
    """The fuzz targets start from blobs that work."""
    for name in ("full", "full_raw"):
        assert _same(apply_version(parse_blob(VALID[name])), BASE)
    for name in ("delta", "delta_raw"):
        assert _same(apply_version(parse_blob(VALID[name]), BASE), NEW)


# ------------------------------------------------------------------------------ blobs

def _parse_and_apply(buf: bytes, base: Bits | None) -> Bits | WeightIntegrityError:
    """The property: a parsed and applied version, or a WeightIntegrityError; ``base`` (a
    delta's) is never changed."""
    before = {n: b.copy() for n, (_d, b) in (base or {}).items()}
    try:
        read_header(buf)
        out = apply_version(parse_blob(buf, source="fuzz"), base)
    except WeightIntegrityError as e:
        assert str(e)
        event(f"refused: {type(e).__name__}")
        return e
    finally:
        assert all(np.array_equal(before[n], b) for n, (_d, b) in (base or {}).items())
    event("applied")
    return out


def _header_blob(header: Any, payload: bytes) -> bytes:
    """A blob with a well-formed prefix (magic, format, length, crc) around ``header``."""
    hbytes = msgspec.msgpack.encode(header)
    return struct.pack("<4sHHII", MAGIC, FORMAT, 0, len(hbytes), zlib.crc32(hbytes)) + (
        hbytes + payload)


DIGEST = "blake3:" + "0" * 32

#: a full tensor whose header claims far more elements than its payload holds: numpy was
#: asked for them before the payload was checked (MemoryError for 4 TiB, ValueError for more
#: than numpy can address, ValueError for more than 64 dimensions), not WeightIntegrityError —
#: and a syncer stops on anything but an AstraflowError
HUGE = [
    _header_blob({"kind": "full", "version": 1, "tensors": [
        {"name": "w", "dtype": "float32", "shape": shape, "enc": enc, "offset": 0,
         "length": len(payload), "digest": DIGEST}]}, payload)
    for shape, enc, payload in [
        ([1 << 40], "raw", b"abcd"),
        ([1 << 62, 4], "raw", b"abcd"),
        ([1 << 31] * 3, "zplanes", b"abcd"),
        ([1] * 70, "raw", b"abcd"),
        ([0, 1 << 62], "raw", b""),
        # a zstd frame that declares 4 GiB (single segment, 8-byte size) in one RLE block
        ([1 << 30], "zplanes", b"\x28\xb5\x2f\xfd\xe0" + (4 << 30).to_bytes(8, "little")
         + ((1 << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\0"),
    ]
]


@fuzz(200)
@given(st.binary(max_size=128), st.booleans())
@example(HUGE[0], False)
@example(HUGE[1], False)
@example(HUGE[2], False)
@example(HUGE[3], False)
@example(HUGE[4], False)
@example(HUGE[5], False)
def test_any_bytes_give_a_version_or_an_integrity_error(data: bytes, with_base: bool) -> None:
    _parse_and_apply(data, {n: (d, b.copy()) for n, (d, b) in BASE.items()} if with_base
                     else None)


def test_a_huge_tensor_is_refused_before_anything_is_allocated() -> None:
    for blob in HUGE:
        with pytest.raises(WeightIntegrityError, match="tensor 'w'"):
            parse_blob(blob)


@st.composite
def mutated_blobs(draw: st.DrawFn) -> tuple[bytes, str]:
    """A valid blob with bytes flipped, set, inserted, deleted or cut off anywhere."""
    name = draw(st.sampled_from(sorted(VALID)))
    data = bytearray(VALID[name])
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(data) - 1) | st.integers(0, min(len(data) - 1, 40)))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data), name


@fuzz(200)
@given(mutated_blobs())
def test_mutated_blobs_give_a_version_or_an_integrity_error(case: tuple[bytes, str]) -> None:
    data, name = case
    _parse_and_apply(data, {n: (d, b.copy()) for n, (d, b) in BASE.items()}
                     if name.startswith("delta") else None)


_INTS = (st.integers(-2, 70) | st.integers(-(2**63), 2**64 - 1)
         | st.sampled_from([0, 1, 4, 16, 1 << 31, 1 << 32, 1 << 40, 1 << 62]))
_ANY = st.none() | st.booleans() | _INTS | st.floats() | st.text(max_size=6) | st.binary(max_size=6)


@st.composite
def forged_headers(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A blob whose prefix and checksum are right around a header of valid msgpack that is a
    valid blob header with its fields changed (any value, any number, a huge shape), the
    payload of a valid blob (or any bytes) after it."""
    name = draw(st.sampled_from(sorted(VALID)))
    blob = parse_blob(VALID[name])
    header = msgspec.to_builtins(blob.header)
    payload = bytes(memoryview(blob.buf)[blob.payload_start:])
    for _ in range(draw(st.integers(1, 3))):
        t = draw(st.sampled_from(header["tensors"] or [header]))
        key = draw(st.sampled_from(sorted(t) + ["shape_dim"]))
        if key == "shape_dim" and "shape" in t:
            t["shape"] = draw(st.lists(_INTS, max_size=5) | st.just([1] * 70))
        elif key in t:
            t[key] = draw(_INTS if isinstance(t[key], int) else _ANY)
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=64))
    return _header_blob(header, payload), name.startswith("delta")


@fuzz(300)
@given(forged_headers())
def test_forged_headers_give_a_version_or_an_integrity_error(case: tuple[bytes, bool]) -> None:
    data, delta = case
    _parse_and_apply(data, {n: (d, b.copy()) for n, (d, b) in BASE.items()} if delta else None)


# ------------------------------------------------------------------------------ the codec

def _frames(body: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid zstd frames (with and without a declared size) of ``body``, or any bytes."""
    def frame(data: bytes, declare: bool) -> bytes:
        return zstandard.ZstdCompressor(write_content_size=declare).compress(data)
    return st.builds(frame, body, st.booleans()) | st.binary(max_size=48)


@st.composite
def deltas(draw: st.DrawFn) -> tuple[Encoded, np.ndarray]:
    """A delta with any parameters whose payload is a zstd frame of any body (often the
    body's size is the one the parameters call for), and a target to apply it to."""
    n = draw(st.integers(0, 40))
    dtype = draw(st.sampled_from([np.uint16, np.uint32]))
    k = draw(st.integers(-1, n + 2) | _INTS)
    gw, vw = draw(st.integers(-1, 9) | _INTS), draw(st.integers(-1, 5))
    values = draw(st.sampled_from(["sub", "raw", "", "xyz"]))
    if 0 < k <= 64 and 0 <= gw <= 8 and 0 <= vw <= 4:  # a body of about the right size
        size = -(-k // 2) + k * gw + (-(-k // 4) if values == "sub" else k * vw)
        size += draw(st.sampled_from([0, 0, 0, -1, 1, vw, 2 * vw]))
        body = draw(st.binary(min_size=max(0, size), max_size=max(0, size)))
    else:
        body = draw(st.binary(max_size=32))
    payload = draw(_frames(st.just(body)) | st.just(b""))
    target = np.arange(n, dtype=dtype)
    return Encoded("delta", payload, k, gw, vw, values), target


@fuzz(300)
@given(deltas())
def test_a_delta_applies_or_is_refused_leaving_its_target(case: tuple[Encoded, np.ndarray]
                                                          ) -> None:
    enc, target = case
    before = target.copy()
    try:
        changed = decode_delta(enc, target, tensor="w", offset=16)
    except WeightIntegrityError as e:
        assert "tensor 'w'" in str(e)
        assert np.array_equal(target, before), "a refused delta leaves the target as it was"
        event("refused")
        return
    event("applied")
    assert changed == max(enc.changed, 0)
    assert int(np.count_nonzero(target != before)) <= changed


@fuzz(200)
@given(st.sampled_from(["raw", "zplanes", "delta", ""]), st.integers(0, 40),
       st.sampled_from([np.uint16, np.uint32]), st.data())
def test_a_full_tensor_decodes_or_is_refused(enc: str, n: int, dtype: type, data: st.DataObject
                                             ) -> None:
    out = np.zeros(n, dtype=dtype)
    want = out.nbytes
    body = data.draw(st.binary(min_size=want, max_size=want) | st.binary(max_size=2 * want + 4))
    payload = data.draw(_frames(st.just(body)) | st.just(body))
    try:
        decode_full(Encoded(enc, payload), out, tensor="w", offset=16)
    except WeightIntegrityError as e:
        assert "tensor 'w'" in str(e)
        event("refused")
        return
    event("decoded")


# ------------------------------------------------------------------------------ safetensors

@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _read(path: Path, data: bytes) -> tuple[Bits, dict[str, str]] | WeightIntegrityError:
    path.write_bytes(data)
    try:
        tensors, meta = read_safetensors(path)
    except WeightIntegrityError as e:
        assert str(path) in str(e)
        event("refused")
        return e
    event("read")
    for name, (dtype, bits) in tensors.items():
        assert dtype in DTYPES and bits.dtype == DTYPES[dtype].bits, name
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    return tensors, meta


def _safetensors(header: Any, data: bytes) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _json_values() -> st.SearchStrategy[Any]:
    leaves = (st.none() | st.booleans() | _INTS | st.floats(allow_nan=False, allow_infinity=False)
              | st.text(max_size=6) | st.sampled_from(["BF16", "F16", "F32", "I64", "F8_E4M3"]))
    keys = st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__"]) | st.text(
        max_size=4)
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=3)
                        | st.dictionaries(keys, kids, max_size=4), max_leaves=12)


@st.composite
def safetensors_files(draw: st.DrawFn) -> bytes:
    """A header of one or more entries of any shape (most of them close to valid), data after."""
    entries: dict[str, Any] = {}
    for i in range(draw(st.integers(0, 3))):
        entry = {"dtype": draw(st.sampled_from(["BF16", "F16", "F32"]) | _json_values()),
                 "shape": draw(st.lists(st.integers(-1, 4), max_size=3) | _json_values()),
                 "data_offsets": draw(st.lists(st.integers(-1, 40), min_size=2, max_size=2)
                                      | _json_values())}
        for key in draw(st.lists(st.sampled_from(sorted(entry)), max_size=1)):
            del entry[key]
        entries[f"t{i}"] = entry if draw(st.integers(0, 5)) else draw(_json_values())
    if draw(st.booleans()):
        entries["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3),
                                                       max_size=2) | _json_values())
    return _safetensors(entries, draw(st.binary(max_size=40)))


#: data_offsets given as an object unpacked into its two keys; a list dtype (unhashable); a
#: negative, fractional or non-list shape; metadata that is not an object; a dimension past
#: what numpy addresses; a header nested past the JSON parser's recursion limit: each raised
#: TypeError, ValueError, AttributeError or RecursionError instead of WeightIntegrityError
BAD_SAFETENSORS = [
    _safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": {"x": 1, "y": 2}}}, b"\0" * 8),
    _safetensors({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": "ab", "data_offsets": [0, 4]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 8),
    _safetensors({"a": {"dtype": "F32", "shape": [0, 1 << 70], "data_offsets": [0, 0]}}, b""),
    _safetensors({"a": {"dtype": "F32", "shape": [1] * 70, "data_offsets": [0, 4]}}, b"\0" * 4),
    _safetensors({"a": {"dtype": "BF16", "shape": [0, 1 << 62], "data_offsets": [0, 0]}}, b""),
    _safetensors({"__metadata__": [1, 2]}, b""),
    _safetensors(b"[" * 100_000, b""),
]


@fuzz(200)
@given(safetensors_files())
@example(BAD_SAFETENSORS[0])
@example(BAD_SAFETENSORS[1])
@example(BAD_SAFETENSORS[2])
@example(BAD_SAFETENSORS[3])
@example(BAD_SAFETENSORS[4])
@example(BAD_SAFETENSORS[5])
@example(BAD_SAFETENSORS[6])
@example(BAD_SAFETENSORS[7])
@example(BAD_SAFETENSORS[8])
@example(BAD_SAFETENSORS[9])
@example(BAD_SAFETENSORS[10])
@example(BAD_SAFETENSORS[11])
def test_a_safetensors_header_reads_or_is_refused(scratch: Path, data: bytes) -> None:
    _read(scratch / "fuzz.safetensors", data)


def test_malformed_safetensors_entries_are_integrity_errors(tmp_path: Path) -> None:
    for i, data in enumerate(BAD_SAFETENSORS):
        (tmp_path / f"{i}.safetensors").write_bytes(data)
        with pytest.raises(WeightIntegrityError, match=f"{i}.safetensors"):
            read_safetensors(tmp_path / f"{i}.safetensors")


@pytest.fixture(scope="module")
def valid_safetensors(scratch: Path) -> bytes:
    write_safetensors(scratch / "valid.safetensors", BASE, {"step": "3"})
    return (scratch / "valid.safetensors").read_bytes()


@fuzz(200)
@given(st.data())
def test_mutated_safetensors_read_or_are_refused(scratch: Path, valid_safetensors: bytes,
                                                 data: st.DataObject) -> None:
    buf = bytearray(valid_safetensors)
    for _ in range(data.draw(st.integers(1, 3))):
        if not buf:
            break
        at = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip":
            buf[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del buf[at:at + data.draw(st.integers(1, 4))]
        else:
            del buf[at:]
    _read(scratch / "mutated.safetensors", bytes(buf))


# ------------------------------------------------------------------------------ blob paths

FIRST = set(string.ascii_letters + string.digits + "_")
REST = FIRST | set(".=+-")


def documented_rule(path: object) -> bool:
    """check_path's docstring, restated: '/'-separated segments of letters, digits and
    ``_ . = + -`` (ASCII), none starting with a dot, none empty, at most 128 characters each
    (the pattern's bound), the whole at most 512 characters."""
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH:
        return False
    for seg in path.split("/"):
        if not 0 < len(seg) <= 128 or seg[0] not in FIRST or not set(seg) <= REST:
            return False
    return True


_SEGMENT_CHARS = st.sampled_from(sorted(REST) + [".", "/", "\\", "\n", "\r", "\t", " ", "\x00",
                                                 "~", ":", "%", "é", "٣", "Ａ", "ı", "K"])


@st.composite
def paths(draw: st.DrawFn) -> str:
    """Mostly near-valid paths: segments of allowed characters with a few odd ones, segment
    lengths around 128 and path lengths around 512; also any text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=40))
    segs = []
    for _ in range(draw(st.integers(1, 6))):
        length = draw(st.integers(0, 8) | st.sampled_from([127, 128, 129]))
        segs.append("".join(draw(st.lists(_SEGMENT_CHARS if draw(st.integers(0, 3)) == 0
                                          else st.sampled_from(sorted(REST)),
                                          min_size=length, max_size=length))))
    path = "/".join(segs)
    if draw(st.booleans()):
        path = path[:draw(st.sampled_from([511, 512, 513]))]
    return path


@fuzz(300)
@given(paths() | st.none() | st.integers() | st.binary(max_size=8))
@example("solver/v0000000042.delta.afw")
@example("a/b\n")
@example("../etc/passwd")
@example("a" * 128)
@example("a" * 129)
@example("/".join(["a" * 128] * 4) + "/b")
@example("٣")
def test_check_path_accepts_exactly_the_documented_paths(path: object) -> None:
    accepted = documented_rule(path)
    event("accepted" if accepted else "refused")
    if accepted:
        assert check_path(path) == path  # type: ignore[arg-type]
        return
    with pytest.raises(UnsafePathError, match="refused blob path") as err:
        check_path(path)  # type: ignore[arg-type]
    assert isinstance(err.value, WeightStoreError)
