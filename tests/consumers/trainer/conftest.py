"""Fixtures of the trainer tests: a tiny model directory, bus URLs, experiment configs."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny arithmetic model directory (built once per session, seed 0)."""
    from astraflow.models.tiny import build_model, build_tokenizer, save

    tok = build_tokenizer("arith")
    return save(build_model(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def experiment(tmp_path: Path, tiny_dir: Path) -> Callable[..., Any]:
    """``experiment(trainer={...}, url=...)``: an ExperimentConfig with the tiny model, a
    unique run name, a short session timeout, on an embedded bus in tmp_path by default."""
    from astraflow.config import ExperimentConfig

    def make(trainer: dict[str, Any] | None = None, url: str | None = None,
             **top: Any) -> Any:
        body = {"run": f"r{uuid.uuid4().hex[:8]}",
                "bus": {"url": url or f"embedded://{tmp_path}/bus.db"},
                "models": {"default": {"path": str(tiny_dir)}},
                "trainer": {"session_timeout_s": 1.0, "poll_timeout_s": 0.1,
                            **(trainer or {})},
                **top}
        return ExperimentConfig.model_validate(body)

    return make
