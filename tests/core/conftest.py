"""Fixtures shared by the core tests: a bus of each backend and unique topic/group names."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from astraflow.core.bus import Bus, connect


@pytest.fixture
def bus(bus_url: str) -> Iterator[Bus]:
    b = connect(bus_url)
    yield b
    b.close()


@pytest.fixture
def new_topic(bus: Bus) -> Callable[..., str]:
    """Create a topic with a unique name: ``new_topic(partitions=4)``."""

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        bus.create_topics({name: partitions})
        return name

    return make


@pytest.fixture
def new_group() -> Callable[[], str]:
    return lambda: f"g-{uuid.uuid4().hex[:12]}"
