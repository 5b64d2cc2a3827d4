"""The per-tensor codec is bit-exact for every bit pattern, shape and density."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from weights_helpers import mutate, random_bits

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import Hasher, digest
from astraflow.weights.codec import (
    Encoded,
    changed_positions,
    decode_delta,
    decode_full,
    encode_delta,
    encode_full,
    from_planes,
    to_planes,
    unzigzag,
    zigzag,
)

SHAPES = [(), (0,), (0, 3), (1,), (2,), (7,), (3, 5, 7), (1023,), ((1 << 18) + 3,)]
DTYPES = ["bfloat16", "float16", "float32"]


def roundtrip_delta(base: np.ndarray, new: np.ndarray, values: str = "sub") -> Encoded:
    h = Hasher()
    enc = encode_delta(base.reshape(-1), new.reshape(-1), values=values, hasher=h)
    out = base.copy()
    changed = decode_delta(enc, out.reshape(-1))
    assert out.tobytes() == new.tobytes()
    assert changed == int(np.count_nonzero(base != new))
    assert h.hexdigest() == digest(new)
    return enc


def test_zigzag_is_a_bijection_on_every_16_bit_difference() -> None:
    d = np.arange(1 << 16, dtype=np.uint16)
    z = zigzag(d)
    assert len(np.unique(z)) == 1 << 16
    assert np.array_equal(unzigzag(z), d)
    # ±1 and ±2 units in the last place become the smallest codes
    assert zigzag(np.array([0, 0xFFFF, 1, 0xFFFE, 2], np.uint16)).tolist() == [0, 1, 2, 3, 4]


def test_zigzag_32_bit() -> None:
    rng = np.random.default_rng(0)
    d = np.concatenate([rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32),
                        np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], np.uint32)])
    assert np.array_equal(unzigzag(zigzag(d)), d)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_byte_planes_roundtrip(width: int) -> None:
    rng = np.random.default_rng(width)
    x = rng.integers(0, 1 << (8 * width), 1001, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(from_planes(to_planes(x, width), len(x), width, x.dtype), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.3, 1.0])
def test_delta_roundtrip_random_bits(dtype: str, shape: tuple[int, ...], fraction: float) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((dtype, shape, fraction)).encode()))
    base = random_bits(rng, dtype, shape)
    new = mutate(rng, base, fraction)
    roundtrip_delta(base, new)
    roundtrip_delta(base, new, values="raw")


def test_every_16_bit_pattern_to_every_other_class() -> None:
    """All 65,536 patterns as base, moved to NaNs with other payloads, ±0, ±inf, subnormals,
    and a random permutation of all patterns."""
    rng = np.random.default_rng(1)
    base = np.arange(1 << 16, dtype=np.uint16)
    specials = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001,
                         0x8001, 0x007F, 0x7C00, 0xFC00, 0x7E00, 0x03FF], dtype=np.uint16)
    for new in [rng.permutation(base), np.resize(specials, base.shape), base ^ 0x8000,
                base + np.uint16(1), base - np.uint16(1)]:
        roundtrip_delta(base, new)
        roundtrip_delta(new, base)
        full = np.empty_like(new)
        decode_full(encode_full(new), full)
        assert full.tobytes() == new.tobytes()


def test_fp32_special_patterns() -> None:
    pats = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                     0xFFFFFFFF, 1, 0x807FFFFF, 0x3F800000], dtype=np.uint32)
    base = np.resize(pats, 1000)
    new = np.roll(base, 3)
    roundtrip_delta(base, new)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_full_roundtrip(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    words = random_bits(rng, dtype, shape).reshape(-1)
    for compress in (True, False):
        enc = encode_full(words, compress=compress)
        out = np.empty_like(words)
        decode_full(enc, out)
        assert out.tobytes() == words.tobytes()


def test_full_compresses_low_entropy_planes() -> None:
    x = (np.random.default_rng(0).standard_normal(100_000) * 0.02).astype(np.float32)
    enc = encode_full(x.view(np.uint32))
    assert enc.enc == "zplanes" and len(enc.payload) < 0.95 * x.nbytes


def test_large_sparse_delta_is_small() -> None:
    rng = np.random.default_rng(3)
    base = random_bits(rng, "bfloat16", (4_000_000,))
    new = base.copy()
    idx = rng.choice(base.size, 40_000, replace=False)
    new[idx] += np.uint16(1)
    enc = roundtrip_delta(base, new)
    assert enc.changed == 40_000
    assert len(enc.payload) < base.nbytes / 80


def test_changed_positions_chunk_boundaries() -> None:
    n = (1 << 18) * 2 + 5
    base = np.zeros(n, np.uint16)
    new = base.copy()
    pos = [0, (1 << 18) - 1, 1 << 18, (1 << 19) + 4]
    new[pos] = 1
    assert changed_positions(base, new).tolist() == pos


def test_corrupt_delta_payload_is_rejected_and_target_untouched() -> None:
    rng = np.random.default_rng(4)
    base = random_bits(rng, "bfloat16", (5000,))
    new = mutate(rng, base, 0.05)
    enc = encode_delta(base, new)
    for bad in (enc.payload[:-3], enc.payload[:5] + bytes([enc.payload[5] ^ 0xFF])
                + enc.payload[6:], b""):
        target = base.copy()
        broken = Encoded("delta", bad, enc.changed, enc.gap_width, enc.value_width, "sub")
        with pytest.raises(WeightIntegrityError, match="tensor 'w' at blob offset 99"):
            decode_delta(broken, target, tensor="w", offset=99)
        assert target.tobytes() == base.tobytes()


def test_delta_parameters_are_validated() -> None:
    base = np.zeros(10, np.uint16)
    new = base.copy()
    new[[2, 9]] = 5
    enc = encode_delta(base, new)
    for changed, gw, vw in ((11, enc.gap_width, enc.value_width), (2, 9, 0), (2, 0, 3)):
        with pytest.raises(WeightIntegrityError, match="bad delta parameters"):
            decode_delta(Encoded("delta", enc.payload, changed, gw, vw, "sub"), base.copy(),
                         tensor="w")
    # plausible parameters that do not match the payload
    with pytest.raises(WeightIntegrityError, match="payload declares"):
        decode_delta(Encoded("delta", enc.payload, 2, 2, 0, "sub"), base.copy(), tensor="w")
    # positions past the end of a shorter tensor
    with pytest.raises(WeightIntegrityError, match="positions run past|outside"):
        decode_delta(enc, np.zeros(5, np.uint16), tensor="w")


def test_full_payload_size_is_checked() -> None:
    words = np.arange(100, dtype=np.uint16)
    with pytest.raises(WeightIntegrityError, match="raw payload of 199 bytes"):
        decode_full(Encoded("raw", words.tobytes()[:-1]), np.empty_like(words), tensor="w")
    enc = encode_full(np.zeros(1000, np.uint16))
    with pytest.raises(WeightIntegrityError, match="declares 2000 bytes, expected 2002"):
        decode_full(enc, np.empty(1001, np.uint16), tensor="w")
