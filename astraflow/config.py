"""The experiment config: one YAML file describes an experiment (DESIGN.md §10).

Each subpackage owns the model of its section; this module only composes them. Load with
:func:`load_experiment` (unknown keys rejected, every problem reported at once, ``--set``
overrides applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pydantic

from astraflow.consumers.rollout.config import RolloutConfig
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.core.bus.types import Bus
from astraflow.core.config import Section, load
from astraflow.policies.config import DataConfig
from astraflow.producers.config import ProducerConfig
from astraflow.weights.config import WeightsConfig


class BusConfig(Section):
    """Where the topics live."""

    url: str = pydantic.Field(
        "embedded://{out}/bus.db",
        description="embedded:///path/bus.db or kafka://host:port[,host:port]; {out} is the "
                    "run directory")
    options: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra client settings (Kafka: SASL/SSL, ...)")
    partitions: dict[str, int] = pydantic.Field(
        default_factory=dict, description="partition count per logical topic, e.g. tasks: 8")


class ExperimentConfig(Section):
    """An experiment: its run name, bus, trainable policies and every role's section."""

    run: str = pydantic.Field("quickstart", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                              description="run name; topics are af.<run>.<name>")
    seed: int = 0
    policies: list[str] = pydantic.Field(["default"], min_length=1,
                                         description="trainable policies (roles)")
    bus: BusConfig = BusConfig()
    producer: ProducerConfig = ProducerConfig()
    rollout: RolloutConfig = RolloutConfig()
    data: DataConfig = DataConfig()
    trainer: TrainerConfig = TrainerConfig()
    weights: WeightsConfig = WeightsConfig()


def load_experiment(path: str | Path | None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    return load(ExperimentConfig, path, overrides)


def open_bus(config: ExperimentConfig, out: str | Path = ".") -> Bus:
    """Connect to the experiment's bus (``{out}`` in the URL is the run directory) and create
    every topic of the run (idempotent), so any role may start first."""
    from astraflow.core.bus import connect
    from astraflow.core.topics import run_topics

    url = config.bus.url.replace("{out}", str(Path(out).resolve()))
    bus = connect(url, config=config.bus.options)
    bus.create_topics(run_topics(config.run, config.policies, config.bus.partitions))
    return bus
