"""Codec benchmark on a synthetic bf16 model (``astraflow weights bench``, ``bench/weights.py``).

Tensors with the shapes of a decoder-only LM hold bf16 weights drawn like a trained model's; a
version step changes each value with probability ``1 - unchanged`` by a fixed distribution of
bf16 steps (:func:`step`), and the codec is timed both ways against baselines measured in the
same run. Results: docs/weights.md#benchmarks."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import zstandard

from astraflow.weights.bits import digest
from astraflow.weights.blob import Bits, apply_version, encode_version, parse_blob

#: name → (dtype, bits). Shapes of a small Llama-like model, scaled by layer count.
Model = dict[str, tuple[str, np.ndarray]]


def model_shapes(params: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a decoder-only LM with at least ``params`` parameters (hidden 1024 and
    a 32k vocabulary from 100M up; narrower below, for quick runs)."""
    hidden = int(min(1024, max(64, math.sqrt(params / 40) // 64 * 64)))
    vocab = 32000 if params >= 100_000_000 else max(256, params // (4 * hidden))
    inter = hidden * 11 // 4
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (vocab, hidden)}
    total = vocab * hidden
    layer = 0
    while total < params:
        p = f"layers.{layer}."
        for name, shape in (("attn.q", (hidden, hidden)), ("attn.k", (hidden, hidden)),
                            ("attn.v", (hidden, hidden)), ("attn.o", (hidden, hidden)),
                            ("mlp.gate", (inter, hidden)), ("mlp.up", (inter, hidden)),
                            ("mlp.down", (hidden, inter)), ("norm1", (hidden,)),
                            ("norm2", (hidden,))):
            shapes[p + name + ".weight"] = shape
            total += math.prod(shape)
        layer += 1
    shapes["norm.weight"] = (hidden,)
    return shapes


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (round to nearest even), as uint16 bits."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def synthetic_model(params: int, seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    out: Model = {}
    for name, shape in model_shapes(params).items():
        if len(shape) == 1:
            x = 1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
        else:
            x = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        out[name] = ("bfloat16", to_bf16_bits(x))
    return out


def step(model: Model, unchanged: float, seed: int = 1) -> tuple[Model, np.ndarray]:
    """A new version of ``model``: each value changes with probability ``1 - unchanged``.
    Returns it and every change as a signed step in units in the last place."""
    rng = np.random.default_rng(seed)
    out: Model = {}
    steps = []
    for name, (dtype, bits) in model.items():
        new = bits.copy()
        flat = new.reshape(-1)
        k = rng.binomial(flat.size, 1.0 - unchanged)
        idx = np.unique(rng.integers(0, flat.size, size=int(k * 1.05) + 16))
        if len(idx) > k:  # exactly k distinct positions, uniformly at random
            idx = np.sort(rng.choice(idx, size=k, replace=False))
        r = rng.random(len(idx))
        mag = np.where(r < 0.877, 1, np.where(r < 0.927, 2, rng.integers(3, 17, len(idx))))
        d = (mag * rng.choice(np.array([-1, 1]), len(idx))).astype(np.int32)
        flat[idx] = (flat[idx].astype(np.int32) + d).astype(np.uint16)
        steps.append(d)
        out[name] = (dtype, new)
    return out, np.concatenate(steps)


def entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


@dataclass
class CodecResult:
    params: int
    unchanged: float  # measured fraction of values unchanged
    dense_bytes: int
    delta_bytes: int
    vs_dense: float  # dense bf16 bytes / delta bytes
    vs_dense_zstd: float  # zstd -3 of the new dense bf16 / delta bytes
    vs_index_values: float  # uint32 index + raw bf16 value (6 bytes per change) / delta bytes
    floor_bytes: int  # entropy of the positions (binomial) + of the value steps
    vs_floor: float  # delta bytes / floor bytes (1.0 = at the floor)
    encode_gbps: float  # GB of dense model per second, one core
    decode_gbps: float  # decode + apply + verify digests, GB of model per second

    def row(self) -> dict[str, object]:
        return asdict(self)


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(base: Model, new: Model, steps: np.ndarray, *, repeat: int = 3,
            zstd_level: int = 3) -> CodecResult:
    """Size and speed of a delta from ``base`` to ``new`` against the baselines."""
    n = sum(b.size for _d, b in base.values())
    dense = 2 * n
    k = len(steps)
    # the publisher knows the digests of the version it published last: not part of encoding
    base_digests = {name: digest(b) for name, (_d, b) in base.items()}
    enc = encode_version(new, version=1, base=base, base_version=0, base_digests=base_digests)
    t_enc = _best(lambda: encode_version(new, version=1, base=base, base_version=0,
                                         base_digests=base_digests), repeat)
    blob = parse_blob(enc.blob)
    t_dec = math.inf
    for _ in range(repeat):
        target: Bits = {name: (d, b.copy()) for name, (d, b) in base.items()}  # not timed
        t = time.perf_counter()
        for entry in parse_blob(enc.blob).header.tensors:
            blob.decode_into(entry, target[entry.name][1].reshape(-1))
        t_dec = min(t_dec, time.perf_counter() - t)
        del target
    check = apply_version(blob, base, verify_base=False)
    assert all(np.array_equal(check[name][1], new[name][1]) for name in new)
    cctx = zstandard.ZstdCompressor(level=zstd_level, threads=0)
    dense_zstd = sum(len(cctx.compress(b.tobytes())) for _d, b in new.values())
    p = k / n
    h_pos = 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    _vals, counts = np.unique(steps, return_counts=True)
    floor = (n * h_pos + k * entropy_bits(counts)) / 8
    size = len(enc.blob)
    return CodecResult(
        params=n, unchanged=1 - p, dense_bytes=dense, delta_bytes=size,
        vs_dense=dense / size, vs_dense_zstd=dense_zstd / size, vs_index_values=6 * k / size,
        floor_bytes=int(floor), vs_floor=size / max(floor, 1.0),
        encode_gbps=dense / t_enc / 1e9, decode_gbps=dense / t_dec / 1e9)


def run(params: int = 100_000_000, unchanged: tuple[float, ...] = (0.989, 0.978),
        repeat: int = 3, seed: int = 0) -> list[CodecResult]:
    base = synthetic_model(params, seed)
    results = []
    for i, u in enumerate(unchanged):
        new, steps = step(base, u, seed + 1 + i)
        results.append(measure(base, new, steps, repeat=repeat))
        del new
    return results


def table(results: list[CodecResult]) -> str:
    """A markdown table of results."""
    head = ("| params | unchanged | dense MB | delta MB | × vs dense | × vs dense+zstd "
            "| × vs u32 idx+val | floor MB | delta / floor | encode GB/s | decode+apply GB/s |")
    lines = [head, "|" + "---|" * 11]
    for r in results:
        lines.append(
            f"| {r.params / 1e6:.1f}M | {r.unchanged:.4f} | {r.dense_bytes / 1e6:.1f} "
            f"| {r.delta_bytes / 1e6:.3f} | {r.vs_dense:.1f} | {r.vs_dense_zstd:.1f} "
            f"| {r.vs_index_values:.2f} | {r.floor_bytes / 1e6:.3f} | {r.vs_floor:.3f} "
            f"| {r.encode_gbps:.2f} | {r.decode_gbps:.2f} |")
    return "\n".join(lines)
