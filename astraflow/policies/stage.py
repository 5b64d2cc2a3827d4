"""``run_stage``: build a stage from the experiment config and run it on the run's bus."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.core.errors import ConfigError
from astraflow.policies.config import STAGES
from astraflow.policies.registry import build_chain
from astraflow.policies.runner import StageRunner, stage_topics

if TYPE_CHECKING:
    from astraflow.config import ExperimentConfig
    from astraflow.core.bus.types import Bus


def checkpoint_path(config: ExperimentConfig, stage: str, policy: str | None,
                    out: str | Path = ".") -> Path:
    base = config.data.checkpoint_dir.replace("{out}", str(Path(out).resolve()))
    return Path(base) / f"{config.run}.{stage}{'.' + policy if policy else ''}.ckpt"


def build_runner(config: ExperimentConfig, stage: str, *, policy: str | None = None,
                 out: str | Path = ".", bus: Bus) -> StageRunner:
    """The stage's runner on ``bus`` (whose topics must exist; see ``open_bus``)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    data = config.data
    policies = tuple(config.policies)
    primary = data.primary_policy or policies[0]
    if stage == "batch":
        policy = policy or primary
    elif policy is not None:
        raise ConfigError(f"--policy is for the batch stage (one batcher per policy); the "
                          f"{stage} stage serves every policy")
    chain = build_chain(data, stage, policies=policies, primary=primary, policy=policy,
                        seed=config.seed)
    topics = stage_topics(config.run, stage, chain, policies=policies, primary=primary,
                          policy=policy)
    from astraflow.core.metrics import MetricsEmitter
    from astraflow.core.topics import group_name

    group = group_name(config.run, "policy", stage=stage, policy=policy)

    component = f"policy-{stage}" + (f"-{policy}" if policy else "")
    metrics = MetricsEmitter(bus, run=config.run, role="policy", component=component)
    return StageRunner(bus, chain, topics, stage=stage, policy=policy, component=component,
                       metrics=metrics,
                       checkpoint=checkpoint_path(config, stage, policy, out), group=group,
                       commit_interval_s=data.commit_interval_s, poll_records=data.poll_records,
                       session_timeout=data.session_timeout_s)


def run_stage(config: ExperimentConfig, stage: str, *, policy: str | None = None,
              out: str | Path = ".", bus: Bus | None = None, max_records: int | None = None,
              timeout: float | None = None, should_stop: Callable[[], bool] | None = None
              ) -> dict[str, float]:
    """Run one stage processor until ``max_records`` main input records, ``timeout``
    seconds or ``should_stop()``; returns its counters. Opens the run's bus (creating its
    topics) unless ``bus`` is given."""
    from astraflow.config import open_bus
    from astraflow.core.topics import run_topics

    own = bus is None
    if bus is None:
        bus = open_bus(config, out)
    else:
        bus.create_topics(run_topics(config.run, config.policies, config.bus.partitions))
    try:
        runner = build_runner(config, stage, policy=policy, out=out, bus=bus)
        return runner.run(max_records=max_records, timeout=timeout, should_stop=should_stop)
    finally:
        if own:
            bus.close()
