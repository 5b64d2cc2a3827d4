"""Helpers of the weights tests: random tensors as raw bits and optimizer-like steps."""

from __future__ import annotations

import numpy as np

WORD = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}


def random_bits(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Every bit pattern equally likely (NaN payloads, ±0, subnormals, inf included)."""
    word = WORD[dtype]
    return rng.integers(0, np.iinfo(word).max, size=shape, dtype=word, endpoint=True)


def mutate(rng: np.random.Generator, bits: np.ndarray, fraction: float) -> np.ndarray:
    """A copy of ``bits`` with ``fraction`` of the words changed: mostly ±1/±2 in the last
    place (as an optimizer step does), some to arbitrary patterns."""
    new = bits.copy()
    flat = new.reshape(-1)
    if flat.dtype.kind == "f":  # float arrays: change their raw words
        flat = flat.view(f"<u{flat.itemsize}")
    if flat.size == 0:
        return new
    idx = np.flatnonzero(rng.random(flat.size) < fraction)
    step = rng.choice(np.array([1, 2, -1, -2, 7, -300], dtype=np.int64), size=len(idx))
    moved = (flat[idx].astype(np.int64) + step) % (np.iinfo(flat.dtype).max + 1)
    wild = rng.random(len(idx)) < 0.05
    moved[wild] = rng.integers(0, np.iinfo(flat.dtype).max, size=int(wild.sum()))
    moved = moved.astype(flat.dtype)
    same = moved == flat[idx]
    moved[same] ^= 1  # every chosen word really changes
    flat[idx] = moved
    return new
