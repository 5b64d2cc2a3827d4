"""``run_stage``: build a stage from the ``data`` section (plus the run's name, policies and
seed) and run it on the run's bus."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.core.errors import ConfigError
from astraflow.core.paths import expand
from astraflow.policies.config import STAGES, DataConfig
from astraflow.policies.registry import build_chain
from astraflow.policies.routing import BacklogRouter
from astraflow.policies.runner import StageRunner, stage_topics

if TYPE_CHECKING:
    from astraflow.core.bus.types import Bus
    from astraflow.core.claims import BlobStore


def checkpoint_path(data: DataConfig, stage: str, policy: str | None, *, run: str,
                    out: str | Path = ".") -> Path:
    """The state checkpoint of run ``run``'s ``stage`` processor (of ``policy``, for the batch
    stage) under ``data.checkpoint_dir``."""
    base = expand(data.checkpoint_dir, out=out)
    return Path(base) / f"{run}.{stage}{'.' + policy if policy else ''}.ckpt"


def build_runner(data: DataConfig, stage: str, *, run: str, policies: Sequence[str],
                 seed: int = 0, policy: str | None = None, out: str | Path = ".",
                 bus: Bus, claims: BlobStore | None = None,
                 rollout_group: str | None = None,
                 vocab: Mapping[str, int] | None = None) -> StageRunner:
    """The runner of ``stage`` of run ``run`` (trainable ``policies``; ``seed`` seeds the
    policies that draw) on ``bus``, whose topics must exist (see
    :func:`astraflow.core.bus.open_bus`). ``rollout_group``: the consumer group of the
    rollout workers on ``tasks``, whose lag backlog routing reads (``data.task_routing``;
    None: the run's default group). ``vocab``: policy -> vocabulary size, what the token ids
    of a trajectory are checked against (``data.records``; a policy absent: ids only checked
    to be >= 0)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    policies = tuple(policies)
    primary = data.primary_policy or policies[0]
    if stage == "batch":
        policy = policy or primary
    elif policy is not None:
        raise ConfigError(f"--policy is for the batch stage (one batcher per policy); the "
                          f"{stage} stage serves every policy")
    chain = build_chain(data, stage, policies=policies, primary=primary, policy=policy,
                        seed=seed)
    topics = stage_topics(run, stage, chain, policies=policies, primary=primary, policy=policy)
    from astraflow.core.metrics import MetricsEmitter
    from astraflow.core.topics import group_name

    group = group_name(run, "policy", stage=stage, policy=policy)

    component = f"policy-{stage}" + (f"-{policy}" if policy else "")
    metrics = MetricsEmitter(bus, run=run, role="policy", component=component)
    router = None
    if stage == "pre_rollout" and data.task_routing == "backlog":
        router = task_router(bus, run, rollout_group or group_name(run, "rollout"),
                             refresh_s=data.task_routing_refresh_s)
    return StageRunner(bus, chain, topics, stage=stage, policy=policy, component=component,
                       metrics=metrics,
                       checkpoint=checkpoint_path(data, stage, policy, run=run, out=out),
                       claims=claims, router=router,
                       group=group, policies=policies,
                       limits=data.records.limits(vocab),
                       commit_interval_s=data.commit_interval_s, poll_records=data.poll_records,
                       session_timeout=data.session_timeout_s)


def task_router(bus: Bus, run: str, rollout_group: str, *, refresh_s: float = 1.0
                ) -> BacklogRouter:
    """Backlog routing of run ``run``'s ``tasks`` by the lag of ``rollout_group``."""
    from astraflow.core.topics import topic_name

    topic = topic_name(run, "tasks")
    return BacklogRouter(lambda: bus.lag(rollout_group, topic),
                         bus.describe_topic(topic).partitions, refresh_s=refresh_s)


def run_stage(data: DataConfig, stage: str, *, run: str, policies: Sequence[str],
              seed: int = 0, policy: str | None = None, out: str | Path = ".", bus: Bus,
              max_records: int | None = None, timeout: float | None = None,
              should_stop: Callable[[], bool] | None = None,
              claims: BlobStore | None = None,
              rollout_group: str | None = None,
              vocab: Mapping[str, int] | None = None) -> dict[str, float]:
    """Run one stage processor (:func:`build_runner`) until ``max_records`` main input
    records, ``timeout`` seconds or ``should_stop()``; returns its counters."""
    runner = build_runner(data, stage, run=run, policies=policies, seed=seed, policy=policy,
                          out=out, bus=bus, claims=claims, rollout_group=rollout_group,
                          vocab=vocab)
    return runner.run(max_records=max_records, timeout=timeout, should_stop=should_stop)
