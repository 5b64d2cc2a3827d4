"""The one table of topics: names, record types, keys and partition counts (DESIGN.md §2).

Every topic name in AstraFlow comes from :func:`topic_name`; no other module spells one.
Names are namespaced by run: ``af.<run>.<name>``; per-policy topics append the policy:
``af.<run>.batches.<policy>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from astraflow.core.errors import ConfigError
from astraflow.core.records import (
    Batch,
    DeadLetter,
    GroupStats,
    LoadReport,
    Metric,
    Record,
    Task,
    Trajectory,
    TrajectoryGroup,
    WeightManifest,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class TopicDef:
    """How one logical topic is named, keyed and partitioned."""

    name: str
    record: type[Record]
    key: str  # the record field used as the message key
    partitions: int
    per_policy: bool = False
    doc: str = ""


TOPICS: dict[str, TopicDef] = {
    t.name: t
    for t in (
        TopicDef("tasks.raw", Task, "id", 32, doc="tasks from producers, before the gate"),
        TopicDef("tasks", Task, "id", 32, doc="released tasks; the rollout group consumes it"),
        TopicDef("trajectories", Trajectory, "group_id", 32,
                 doc="episodes from rollout workers, keyed by group so a group stays together"),
        TopicDef("stats", GroupStats, "task_id", 8, doc="per-group reward statistics (GRESO)"),
        TopicDef("groups", TrajectoryGroup, "group_id", 8, per_policy=True,
                 doc="finished groups after the post-rollout policies, before batching"),
        TopicDef("batches", Batch, "policy", 1, per_policy=True, doc="training batches"),
        TopicDef("weights", WeightManifest, "policy", 1, per_policy=True,
                 doc="weight-version manifests (blobs live in the weight store)"),
        TopicDef("metrics", Metric, "component", 4, doc="heartbeats and metrics of every process"),
        TopicDef("reports", LoadReport, "run", 1, doc="load reports for the scaler"),
        TopicDef("dlq", DeadLetter, "topic", 1, doc="records no consumer could decode or process"),
    )
}


def _check(kind: str, value: str) -> None:
    if not _NAME.match(value):
        raise ConfigError(f"invalid {kind} name {value!r}: use 1-64 letters, digits, '_' or '-'")


def topic_def(name: str) -> TopicDef:
    try:
        return TOPICS[name]
    except KeyError:
        raise ConfigError(f"unknown topic {name!r}; valid: {', '.join(TOPICS)}") from None


def topic_name(run: str, name: str, policy: str | None = None) -> str:
    """The bus topic name of logical topic ``name`` in run ``run``.

    >>> topic_name("demo", "tasks")
    'af.demo.tasks'
    >>> topic_name("demo", "batches", "solver")
    'af.demo.batches.solver'
    """
    d = topic_def(name)
    _check("run", run)
    if d.per_policy:
        if policy is None:
            raise ConfigError(f"topic {name!r} is per policy: pass policy=")
        _check("policy", policy)
        return f"af.{run}.{name}.{policy}"
    if policy is not None:
        raise ConfigError(f"topic {name!r} is not per policy; do not pass policy={policy!r}")
    return f"af.{run}.{name}"


def run_topics(run: str, policies: list[str], partitions: dict[str, int] | None = None
               ) -> dict[str, int]:
    """Every topic of a run with its partition count (overrides by logical name)."""
    partitions = partitions or {}
    out: dict[str, int] = {}
    for d in TOPICS.values():
        n = partitions.get(d.name, d.partitions)
        for p in (policies if d.per_policy else [None]):
            out[topic_name(run, d.name, p)] = n
    return out
