"""Fixtures of the gateway tests: engines on the tiny ASCII model (``ascii_dir``, built once in
tests/conftest.py), and ``serve``: a gateway over an embedded bus, served by uvicorn on a thread
on a free port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import Served, start

from astraflow.core.bus import connect


@pytest.fixture(scope="session")
def ascii_engine(ascii_dir: Path) -> Any:
    """The hf engine on the tiny model, shared by the tests (it keeps no per-gateway state)."""
    from astraflow.consumers.rollout.engines import build_engine

    return build_engine("hf", model_path=ascii_dir, threads=1, seed=3)


@pytest.fixture(scope="session")
def ascii_continuous_engine(ascii_dir: Path) -> Iterator[Any]:
    """The same model in an hf engine that batches continuously (requests join the running
    batch between decoding steps): what `astraflow serve` runs with
    ``rollout.engine.continuous: true``."""
    from astraflow.consumers.rollout.engines import build_engine

    engine = build_engine("hf", model_path=ascii_dir, threads=1, seed=3, continuous=True)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def ascii_tokenizer() -> Any:
    from astraflow.models.tiny import build_tokenizer

    return build_tokenizer("ascii")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(engines, bus=None, run="r", **gateway_kwargs)``: a started gateway (stopped at
    the end of the test); ``engines`` is an engine (policy ``default``) or policy -> engine.
    ``store_kwargs`` go to the SessionStore. The bus (an embedded one in the test's directory
    unless given) stays open until the end of the test."""
    running: list[Served] = []
    buses: list[Any] = []

    def make(engines: Any, *, bus: Any = None, **kwargs: Any) -> Served:
        if bus is None:
            bus = connect(f"embedded://{tmp_path}/bus.db")
            buses.append(bus)
        served = start(engines, bus=bus, **kwargs)
        running.append(served)
        return served

    yield make
    for s in running:
        s.stop()
    for b in buses:
        b.close()


@pytest.fixture(autouse=True, scope="module")
def _restore_torch_threads() -> Iterator[None]:
    """The engine is built with ``threads=1`` (torch's process-wide count): put it back."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
