"""What an experiment config points at, opened: its bus (with the run's topics) and each
policy's model directory. Used by `astraflow run` and the commands that run one role; the
config itself (:mod:`astraflow.config`) only describes and validates.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.config import ExperimentConfig
from astraflow.core.bus.types import Bus


def open_bus(config: ExperimentConfig, out: str | Path = ".", *,
             create_topics: bool = True) -> Bus:
    """Connect to the experiment's bus (``{out}`` in the URL is the run directory) and create
    every topic of the run (idempotent), so any role may start first."""
    from astraflow.core.bus import open_bus as open_run_bus
    from astraflow.core.topics import run_topics

    topics = (run_topics(config.run, config.policies, config.bus.partitions)
              if create_topics else None)
    return open_run_bus(config.bus.url, out, options=config.bus.options, topics=topics)


def create_run_topics(config: ExperimentConfig, bus: Bus) -> None:
    """Create every topic of the experiment's run (idempotent)."""
    from astraflow.core.topics import run_topics

    bus.create_topics(run_topics(config.run, config.policies, config.bus.partitions))


def model_dir(config: ExperimentConfig, policy: str, out: str | Path = ".") -> Path:
    """The model directory of ``policy`` (see :func:`astraflow.models.config.model_dir`)."""
    from astraflow.models.config import model_dir as resolve_model_dir

    return resolve_model_dir(config.model(policy), policy, out)
