"""Fixtures of the weights tests: an embedded bus, a file store, a small model as raw bits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from weights_helpers import random_bits

from astraflow.core.bus import Bus, connect
from astraflow.weights.store import FileStore

Model = dict[str, tuple[str, np.ndarray]]


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    b = connect(f"embedded://{tmp_path}/bus.db")
    yield b
    b.close()


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


@pytest.fixture
def model_factory() -> Callable[..., Model]:
    """``model_factory(seed)``: a small model with every dtype and awkward shapes."""

    def make(seed: int = 0) -> Model:
        rng = np.random.default_rng(seed)
        shapes = {"embed": ("bfloat16", (97, 33)), "scalar": ("bfloat16", ()),
                  "empty": ("float16", (0, 4)), "half": ("float16", (5, 3)),
                  "norm": ("float32", (31,)), "odd": ("bfloat16", (1, 1, 7))}
        return {n: (d, random_bits(rng, d, s)) for n, (d, s) in shapes.items()}

    return make
