"""What a data-algorithm policy is: a pure function of (record, state, context) → records.

A policy object holds only its configuration; everything that changes lives in a separate
*state* (a msgspec Struct made by :meth:`Policy.init_state`, with a ``counts`` dict), which
the stage runner checkpoints (msgpack, never pickle). A test drives a policy without a bus::

    state = policy.init_state()
    out = [o for r in records for o in policy.process(r, state, ctx)]

Required: ``name``, ``consumes`` / ``produces`` (record types), ``init_state()`` and
``process(record, state, ctx)``. Optional hooks, looked up by name (``on_stats``,
``on_version``, ``tick``, ``ready``, ``holds_groups``, ...): docs/policies.md#writing-a-policy.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from astraflow.core.errors import AstraflowError
from astraflow.core.records import Record, TrajectoryGroup


class PolicyError(AstraflowError):
    """A policy could not process a record, or a stage could not be built or run."""


@dataclass
class Context:
    """What a policy may know besides its record and state: the time, the trainer versions
    and where the record being processed lies on the bus.

    ``versions`` holds the newest ``WeightManifest.version`` seen on ``weights.<policy>``;
    a policy with no manifest yet is at version 0 (the initial weights).
    """

    now: float = 0.0
    versions: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    #: (topic, partition, offset) of the main record being processed, set by the stage
    #: runner; None where a policy runs as a pure function (no bus position)
    origin: tuple[str, int, int] | None = None

    def version(self, policy: str) -> int:
        return self.versions.get(policy, 0)


@runtime_checkable
class Policy(Protocol):
    """The one contract of a data-algorithm policy (see the module docstring for hooks)."""

    name: str
    consumes: type[Record]
    produces: type[Record]

    def init_state(self) -> Any: ...

    def process(self, record: Any, state: Any, ctx: Context) -> list[Record]: ...


def group_key(g: TrajectoryGroup) -> str:
    """A group's identity within its policy: its group id, or ``group_id@agent`` for a role's
    group (one policy playing two roles has two groups per task attempt). The agent-less form
    is the group id itself, so states checkpointed before agents stay valid."""
    return f"{g.group_id}@{g.agent}" if g.agent else g.group_id


def bump(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


def remember(recent: dict[str, int], key: str, cap: int) -> bool:
    """Add ``key`` to a bounded insertion-ordered set; False if it was already there.

    A dict (not a set) so that it survives msgpack with its order: the oldest key is evicted
    first once ``cap`` keys are held.
    """
    if key in recent:
        return False
    recent[key] = 1
    while len(recent) > cap:
        del recent[next(iter(recent))]
    return True


_U64 = struct.Struct("<Q")


def uniform(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) that is a pure function of ``seed`` and ``parts``.

    Counter-based randomness: a restarted processor re-deciding the same record draws the
    same number, so its outputs match an uninterrupted run's.
    """
    text = "\x1f".join([str(seed), *map(str, parts)]).encode()
    (n,) = _U64.unpack(hashlib.blake2b(text, digest_size=8).digest())
    return n / 2.0**64


def split(records: Iterable[Record], flow: type[Record]) -> tuple[list[Record], list[Record]]:
    """Records of the ``flow`` type (they go on along the chain) and the rest (side outputs,
    e.g. GroupStats, which go straight to their topic)."""
    main: list[Record] = []
    side: list[Record] = []
    for r in records:
        (main if isinstance(r, flow) else side).append(r)
    return main, side


class GroupRef(msgspec.Struct, tag="TrajectoryGroup", tag_field="schema", kw_only=True):
    """The head of a TrajectoryGroup record (its trajectories are skipped when decoding):
    what the gate needs to count a group accepted onto ``groups.<policy>``."""

    v: int = 1
    group_id: str
    task_id: str = ""
    policy: str = "default"
