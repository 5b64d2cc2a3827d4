"""Blobs: versions round-trip bit-exact; corrupt, truncated or mismatched input is refused with
an error that names the tensor or the offset."""

from __future__ import annotations

import struct
import zlib

import msgspec
import numpy as np
import pytest
from weights_helpers import mutate

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import digest
from astraflow.weights.blob import (
    PREFIX_SIZE,
    BlobHeader,
    apply_version,
    encode_version,
    parse_blob,
    read_header,
)


def step(model: dict, seed: int, fraction: float = 0.02) -> dict:
    rng = np.random.default_rng(seed)
    return {n: (d, mutate(rng, b, fraction)) for n, (d, b) in model.items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n][0] == b[n][0] and a[n][1].shape == b[n][1].shape
        and a[n][1].tobytes() == b[n][1].tobytes() for n in a)


def test_full_and_delta_roundtrip(model_factory) -> None:
    v0 = model_factory()
    v1 = step(v0, 1)
    full = encode_version(v0, version=0)
    assert parse_blob(full.blob).header.kind == "full"
    assert same(apply_version(parse_blob(full.blob)), v0)
    delta = encode_version(v1, version=1, base=v0, base_version=0)
    blob = parse_blob(delta.blob)
    assert (blob.header.kind, blob.header.version, blob.header.base_version) == ("delta", 1, 0)
    assert same(apply_version(blob, v0), v1)
    assert delta.digests == {n: digest(b) for n, (_d, b) in v1.items()}
    assert sum(t.changed for t in blob.header.tensors) == sum(
        int(np.count_nonzero(v0[n][1] != v1[n][1])) for n in v0)


def test_every_truncation_is_rejected(model_factory) -> None:
    v0 = model_factory()
    data = encode_version(step(v0, 1), version=1, base=v0, base_version=0).blob
    for cut in sorted({0, 3, PREFIX_SIZE - 1, PREFIX_SIZE + 5, len(data) // 2, len(data) - 1}):
        with pytest.raises(WeightIntegrityError, match="too short|truncated"):
            apply_version(parse_blob(data[:cut]), v0)


def test_every_flipped_byte_is_caught(model_factory) -> None:
    """A bit flip anywhere — prefix, header or any payload — never yields wrong tensors."""
    v0 = model_factory()
    v1 = step(v0, 2, 0.2)
    data = encode_version(v1, version=1, base=v0, base_version=0).blob
    rng = np.random.default_rng(0)
    positions = set(range(0, PREFIX_SIZE)) | set(rng.integers(0, len(data), 300).tolist())
    for pos in sorted(positions):
        if 6 <= pos < 8:  # flags: reserved, ignored by format 1
            continue
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            out = apply_version(parse_blob(bytes(bad)), v0)
        except WeightIntegrityError:
            continue
        # a flip in bits the decoder never reads (e.g. stream padding) changes nothing
        assert same(out, v1), f"flipped byte {pos} gave wrong tensors"


def test_error_names_the_tensor_and_offset(model_factory) -> None:
    v0 = model_factory()
    enc = encode_version(step(v0, 3, 0.5), version=1, base=v0, base_version=0)
    t = next(t for t in enc.header.tensors if t.name == "embed")
    bad = bytearray(enc.blob)
    bad[enc.payload_start + t.offset + t.length // 2] ^= 0x40
    with pytest.raises(WeightIntegrityError, match=r"tensor 'embed'.*offset \d+"):
        apply_version(parse_blob(bytes(bad)), v0)


def test_bad_magic_and_format() -> None:
    data = encode_version({"w": ("bfloat16", np.zeros(4, np.uint16))}, version=0).blob
    with pytest.raises(WeightIntegrityError, match="not a weight blob"):
        parse_blob(b"PK\x03\x04" + data[4:])
    with pytest.raises(WeightIntegrityError, match="blob format 9"):
        parse_blob(data[:4] + struct.pack("<H", 9) + data[6:])


def forge(header: BlobHeader, payload: bytes) -> bytes:
    hbytes = msgspec.msgpack.encode(header)
    return struct.pack("<4sHHII", b"AFWB", 1, 0, len(hbytes), zlib.crc32(hbytes)) + hbytes + payload


def test_forged_headers_are_validated(model_factory) -> None:
    v0 = model_factory()
    enc = encode_version(step(v0, 4), version=1, base=v0, base_version=0)
    payload = enc.blob[enc.payload_start:]
    cases = {
        "unsupported dtype 'int8'": lambda t: setattr(t, "dtype", "int8"),
        "negative": lambda t: setattr(t, "shape", [-1, 3]),
        "unsupported digest": lambda t: setattr(t, "digest", "md5:00"),
        "truncated": lambda t: setattr(t, "length", t.length + 10_000),
        "in a delta blob": lambda t: setattr(t, "enc", "raw"),
    }
    for message, change in cases.items():
        header = msgspec.msgpack.decode(msgspec.msgpack.encode(enc.header), type=BlobHeader)
        change(header.tensors[0])
        with pytest.raises(WeightIntegrityError, match=message):
            apply_version(parse_blob(forge(header, payload)), v0)


def test_duplicate_tensor_names_are_refused() -> None:
    enc = encode_version({"w": ("bfloat16", np.zeros(4, np.uint16))}, version=0)
    header = enc.header
    header.tensors.append(header.tensors[0])
    with pytest.raises(WeightIntegrityError, match="appears twice"):
        read_header(forge(header, enc.blob[enc.payload_start:]))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("norm"), "tensor 'norm' is in the delta, not in the base"),
    (lambda m: m.update(extra=("bfloat16", np.zeros(3, np.uint16))),
     "tensor 'extra' is in the base, not in the delta"),
    (lambda m: m.update(half=("bfloat16", m["half"][1])), "tensor 'half'.*bfloat16"),
    (lambda m: m.update(embed=("bfloat16", m["embed"][1].reshape(33, 97))),
     r"tensor 'embed'.*\[33, 97\]"),
    (lambda m: m["odd"][1].reshape(-1).__setitem__(0, m["odd"][1].reshape(-1)[0] ^ 1),
     "tensor 'odd': the base is not the one"),
])
def test_mismatched_base_is_refused(model_factory, change, message) -> None:
    v0 = model_factory()
    blob = parse_blob(encode_version(step(v0, 5), version=1, base=v0, base_version=0).blob)
    base = {n: (d, b.copy()) for n, (d, b) in v0.items()}
    change(base)
    with pytest.raises(WeightIntegrityError, match=message):
        apply_version(blob, base)


def test_encoding_refuses_mismatched_versions(model_factory) -> None:
    v0 = model_factory()
    v1 = dict(v0)
    v1["norm"] = ("float32", np.zeros(30, np.uint32))
    with pytest.raises(WeightIntegrityError, match=r"tensor 'norm': base is float32\[31\]"):
        encode_version(v1, version=1, base=v0, base_version=0)
