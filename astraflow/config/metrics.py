"""The ``metrics`` section: where `astraflow run` sends its metrics besides ``metrics.jsonl``
and Prometheus (:mod:`astraflow.run.sinks`, docs/metrics.md)."""

from __future__ import annotations

from typing import Literal

import pydantic

from astraflow.core.config import Section

SinkName = Literal["tensorboard", "wandb"]


class MetricsConfig(Section):
    """Metric sinks of `astraflow run` (each needs its extra: astraflow[tensorboard],
    astraflow[wandb])."""

    sinks: list[SinkName] = pydantic.Field(
        default_factory=list, description="where `astraflow run` also sends every metric the "
        "live view shows, per role and per policy, with the run's name and config: "
        "tensorboard, wandb (metrics.jsonl is always written)")
    tensorboard_dir: str = pydantic.Field(
        "{out}/tensorboard", description="the TensorBoard log directory (the run's events in "
        "<dir>/<run>)")
    wandb_project: str = pydantic.Field("astraflow", description="the wandb project")
    wandb_mode: Literal["online", "offline", "disabled"] | None = pydantic.Field(
        None, description="wandb's mode; null: WANDB_MODE, else wandb's default (online)")
