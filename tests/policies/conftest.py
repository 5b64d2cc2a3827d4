"""Fixtures of the policy tests: a bus URL of each backend and an experiment config maker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., ExperimentConfig]:
    """``make_config(data={...}, url=...)``: an experiment with a unique run name whose
    checkpoints live under tmp_path."""

    def make(data: dict[str, Any] | None = None, url: str | None = None,
             **top: Any) -> ExperimentConfig:
        body: dict[str, Any] = {
            "run": f"r{uuid.uuid4().hex[:8]}",
            "bus": {"url": url or f"embedded://{tmp_path}/bus.db",
                    "partitions": {"tasks.raw": 4, "tasks": 4, "trajectories": 4,
                                   "stats": 2, "groups": 2}},
            "data": {"checkpoint_dir": str(tmp_path / "ckpt"), "session_timeout_s": 1.0,
                     **(data or {})},
            **top,
        }
        return ExperimentConfig.model_validate(body)

    return make
