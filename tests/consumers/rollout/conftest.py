"""Fixtures of the rollout tests: a bus of each backend, tiny local models (built once), the
sandbox's same-uid policy for a user who is not root."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.core.bus import Bus, connect


@pytest.fixture(autouse=True)
def sandbox_same_uid_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as an ordinary user (a developer's laptop, a CI runner), the sandbox's code can only
    run as that user's uid, which ``rollout.sandbox.allow_same_uid`` must accept: the tests
    accept it, as such a user would, so that everything else the sandbox does is still tested
    there (the refusal itself is tested as ``nobody`` and in the uid-0 fallback)."""
    if os.geteuid() != 0:
        from astraflow.consumers.rollout.rewards import sandbox

        monkeypatch.setattr(sandbox.POLICY, "allow_same_uid", True)


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    b = connect(f"embedded://{tmp_path}/bus.db")
    yield b
    b.close()


@pytest.fixture(scope="session")
def arith_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny arith model directory (max 64 positions, 17 tokens)."""
    from astraflow.models.tiny import build_model, build_tokenizer, save

    tok = build_tokenizer("arith")
    return save(build_model(tok, seed=0), tok, tmp_path_factory.mktemp("models") / "tiny-arith")


@pytest.fixture(scope="session")
def ascii_tokenizer() -> object:
    from astraflow.models.tiny import build_tokenizer

    return build_tokenizer("ascii")


@pytest.fixture(autouse=True, scope="module")
def _restore_torch_threads() -> Iterator[None]:
    """Engines built with ``threads=1`` set torch's process-wide thread count; put it back so
    the test packages after this one run as they would alone."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
