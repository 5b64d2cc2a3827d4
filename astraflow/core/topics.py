"""The one table of topics and consumer groups: names, record types, keys, partition counts
and group names (docs/reference/topics.md).

Every topic name in AstraFlow comes from :func:`topic_name`, every message key from
:func:`record_key` (or :func:`route`, which gives both), every consumer-group name from
:func:`group_name`; no other module spells one (whole-topic readers join no group:
``Bus.reader``). Names are
namespaced by run: ``af.<run>.<name>``; per-policy topics append the policy:
``af.<run>.batches.<policy>``. Groups likewise: ``af.<run>.rollout``, so two runs on one
Kafka cluster never share a group (and never rebalance each other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from astraflow.core.errors import ConfigError, SchemaError
from astraflow.core.records import (
    Batch,
    DeadLetter,
    GatewayCall,
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
    # the topic :func:`route` sends a record of this type to when the caller names none; one
    # per record type (``tasks.raw`` is written only by producers, which name it)
    route: bool = True


TOPICS: dict[str, TopicDef] = {
    t.name: t
    for t in (
        TopicDef("tasks.raw", Task, "id", 32, doc="tasks from producers, before the gate",
                 route=False),
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
        TopicDef("dlq", DeadLetter, "key", 1,
                 doc="records no consumer could decode or process, keyed by their original key"),
        TopicDef("gateway", GatewayCall, "session_id", 8,
                 doc="the agent gateway's session events (calls with their exact tokens, "
                     "rewards, ends), keyed by session; a restarted gateway rebuilds from it"),
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


# -- routing: a record's topic and message key --------------------------------------------------

class Route(NamedTuple):
    """Where a record goes: the bus topic and the message key (from the table)."""

    topic: str
    key: bytes | None


class TopicRef(NamedTuple):
    """A bus topic name taken apart: run, logical topic, policy (None: not per policy)."""

    run: str
    name: str
    policy: str | None


_ROUTES: dict[type[Record], TopicDef] = {}
for _d in TOPICS.values():
    if _d.route:
        if _d.record in _ROUTES:  # the table itself is wrong: fail at import, not at runtime
            raise ConfigError(f"two routed topics carry {_d.record.__name__}: "
                              f"{_ROUTES[_d.record].name}, {_d.name}")
        _ROUTES[_d.record] = _d


def record_key(name: str, record: Record) -> bytes | None:
    """The message key of ``record`` on logical topic ``name``: its table key field, UTF-8.

    >>> from astraflow.core.records import Batch
    >>> record_key("batches", Batch(id="b1", policy="solver", seq=0, groups=[]))
    b'solver'
    """
    d = topic_def(name)
    if not isinstance(record, d.record):
        raise SchemaError(f"a {type(record).__name__} record does not go on topic {name!r}, "
                          f"which carries {d.record.__name__} records")
    key = getattr(record, d.key)
    if key is None or isinstance(key, bytes):
        return key
    return str(key).encode()


def route(run: str, record: Record, name: str | None = None) -> Route:
    """The topic and key of ``record`` in run ``run``: on logical topic ``name``, or (None) on
    the topic the table routes its record type to. Per-policy topics take the record's own
    ``policy`` field.

    >>> from astraflow.core.records import Batch
    >>> route("demo", Batch(id="b1", policy="solver", seq=0, groups=[]))
    Route(topic='af.demo.batches.solver', key=b'solver')
    """
    if name is None:
        d = _ROUTES.get(type(record))
        if d is None:
            raise SchemaError(f"no topic carries {type(record).__name__} records; routed: "
                              f"{', '.join(sorted(t.__name__ for t in _ROUTES))}")
        name = d.name
    d = topic_def(name)
    policy = None
    if d.per_policy:
        policy = getattr(record, "policy", None)
        if not policy:
            raise SchemaError(f"topic {name!r} is per policy but the {type(record).__name__} "
                              "record names no policy")
    return Route(topic_name(run, name, policy), record_key(name, record))


def parse_topic(topic: str) -> TopicRef:
    """The run, logical topic and policy of a bus topic name (the inverse of
    :func:`topic_name`).

    >>> parse_topic("af.demo.batches.solver")
    TopicRef(run='demo', name='batches', policy='solver')
    >>> parse_topic("af.demo.tasks.raw")
    TopicRef(run='demo', name='tasks.raw', policy=None)
    """
    prefix, _, rest = topic.partition(".")
    run, _, rest = rest.partition(".")
    if prefix == "af" and _NAME.match(run):
        if rest in TOPICS and not TOPICS[rest].per_policy:
            return TopicRef(run, rest, None)
        name, _, policy = rest.rpartition(".")
        if name in TOPICS and TOPICS[name].per_policy and _NAME.match(policy):
            return TopicRef(run, name, policy)
    raise ConfigError(f"{topic!r} is not a run's topic: expected af.<run>.<name>[.<policy>] "
                      f"with name one of {', '.join(TOPICS)}")


# -- consumer groups ------------------------------------------------------------------------------

#: The policy stages, in flow order (``astraflow.policies.config.STAGES`` has their records).
STAGES = ("pre_rollout", "post_rollout", "batch")

_GROUP = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # what Kafka accepts in names, kept portable


@dataclass(frozen=True)
class GroupDef:
    """The consumer group a role joins and the logical topic it reads."""

    role: str
    input: str | None  # logical topic consumed (None: depends on the stage)
    per_policy: bool = False  # one group per policy (for ``policy``: only the batch stage)
    staged: bool = False  # one group per policy stage, plus a ``.side`` group for side inputs
    doc: str = ""


GROUPS: dict[str, GroupDef] = {
    g.role: g
    for g in (
        GroupDef("rollout", "tasks", doc="every rollout worker of the run: af.<run>.rollout"),
        GroupDef("scaler", "reports", doc="the run's scaler: af.<run>.scaler"),
        GroupDef("trainer", "batches", per_policy=True,
                 doc="the trainer of one policy: af.<run>.trainer.<policy>"),
        GroupDef("policy", None, staged=True,
                 doc="a stage processor: af.<run>.policy.<stage>[.<policy>] (the policy for "
                     "the batch stage only), and its side inputs on <that>.side"),
    )
}


def check_group(name: str) -> str:
    """``name`` if it is a usable consumer-group name (a user's override), else ConfigError."""
    if not _GROUP.match(name):
        raise ConfigError(f"invalid consumer group name {name!r}: use 1-249 letters, digits, "
                          "'.', '_' or '-'")
    return name


def group_name(run: str, role: str, *, policy: str | None = None, stage: str | None = None,
               side: bool = False) -> str:
    """The consumer group ``role`` joins in run ``run``.

    >>> group_name("demo", "rollout")
    'af.demo.rollout'
    >>> group_name("demo", "trainer", policy="solver")
    'af.demo.trainer.solver'
    >>> group_name("demo", "policy", stage="post_rollout")
    'af.demo.policy.post_rollout'
    >>> group_name("demo", "policy", stage="batch", policy="solver", side=True)
    'af.demo.policy.batch.solver.side'
    """
    _check("run", run)
    try:
        g = GROUPS[role]
    except KeyError:
        raise ConfigError(f"unknown consumer-group role {role!r}; valid: "
                          f"{', '.join(GROUPS)}") from None
    parts = ["af", run, role]
    if g.staged:
        if stage not in STAGES:
            raise ConfigError(f"group {role!r} is per stage: pass stage= one of "
                              f"{', '.join(STAGES)} (got {stage!r})")
        parts.append(stage)
    elif stage is not None or side:
        raise ConfigError(f"group {role!r} has no stages; do not pass stage= or side=")
    wants_policy = g.per_policy or (g.staged and stage == "batch")
    if wants_policy:
        if policy is None:
            raise ConfigError(f"group {role!r}{f' stage {stage!r}' if stage else ''} is per "
                              "policy: pass policy=")
        _check("policy", policy)
        parts.append(policy)
    elif policy is not None:
        raise ConfigError(f"group {role!r}{f' stage {stage!r}' if stage else ''} is not per "
                          f"policy; do not pass policy={policy!r}")
    if side:
        parts.append("side")
    return ".".join(parts)
