"""Batcher (batch stage, last): batches of B whole groups for one policy.

Batch ids are ``f"{policy}-{seq}"`` with ``seq`` counting from 0, so a batch produced twice
(a crash between produce and checkpoint) is recognisable by id. A fresh group is put in a
batch at most once; a replayed group may come again, but never twice in the same batch. With
``data.batch_ahead`` set, batch ``seq`` leaves only while ``seq - version < batch_ahead``
(back-pressure at the trainer's door; docs/policies.md).
"""

from __future__ import annotations

import msgspec

from astraflow.core.records import Batch, Group, Record, TrajectoryGroup
from astraflow.policies.base import Context, PolicyError, bump, group_key, remember
from astraflow.policies.env import BuildEnv


class BatcherState(msgspec.Struct, kw_only=True):
    pending: list[TrajectoryGroup] = []
    seq: int = 0
    version: int = 0  # the newest version of the policy's trainer seen (back-pressure)
    seen: dict[str, int] = {}
    counts: dict[str, int] = {}


class Batcher:
    name = "batcher"
    levels = frozenset({"pending", "ahead"})  # current values (gauges), not counts
    consumes = TrajectoryGroup
    produces = Batch

    def __init__(self, *, policy: str, batch_size: int, dedup_window: int = 10_000,
                 ahead: int | None = None) -> None:
        if ahead is not None and ahead < 1:
            raise PolicyError(f"batch_ahead must be >= 1 (or null: no limit), got {ahead}")
        self.policy = policy
        self.batch_size = batch_size
        self.dedup_window = dedup_window
        self.ahead = ahead

    def init_state(self) -> BatcherState:
        return BatcherState()

    def process(self, g: TrajectoryGroup, state: BatcherState, ctx: Context) -> list[Record]:
        if g.policy != self.policy:
            raise PolicyError(f"group {g.group_id!r} of policy {g.policy!r} reached the batcher "
                              f"of policy {self.policy!r}")
        key = group_key(g)
        if any(group_key(p) == key for p in state.pending):
            bump(state.counts, "duplicate_in_batch")
            return []
        if not g.replayed and not remember(state.seen, key, self.dedup_window):
            bump(state.counts, "duplicate")
            return []
        state.pending.append(g)
        bump(state.counts, "groups")
        if g.replayed:
            bump(state.counts, "replayed_groups")
        return self._emit(state)

    def _open(self, state: BatcherState) -> bool:
        return self.ahead is None or state.seq - state.version < self.ahead

    def _emit(self, state: BatcherState) -> list[Record]:
        """Every whole batch that may leave now (oldest groups first)."""
        out: list[Record] = []
        while len(state.pending) >= self.batch_size and self._open(state):
            take, state.pending = (state.pending[:self.batch_size],
                                   state.pending[self.batch_size:])
            out.append(Batch(id=f"{self.policy}-{state.seq}", policy=self.policy,
                             seq=state.seq,
                             groups=[Group(group_id=p.group_id, task_id=p.task_id, refs=p.refs,
                                           trajectories=p.trajectories, replayed=p.replayed)
                                     for p in take]))
            state.seq += 1
            bump(state.counts, "batches")
        if len(state.pending) >= self.batch_size:
            bump(state.counts, "held")
        return out

    def on_version(self, policy: str, old: int, new: int, state: BatcherState,
                   ctx: Context) -> None:
        if policy == self.policy:
            state.version = max(state.version, new)

    def tick(self, state: BatcherState, ctx: Context) -> list[Record]:
        """A batch held back leaves once the trainer caught up."""
        return self._emit(state) if len(state.pending) >= self.batch_size else []

    def ready(self, state: BatcherState) -> bool:
        """False while a whole batch is held back: the stage reads no more groups."""
        return self._open(state) or len(state.pending) < self.batch_size

    def counters(self, state: BatcherState) -> dict[str, int]:
        return {**state.counts, "pending": len(state.pending),
                "ahead": state.seq - state.version}


def build(env: BuildEnv) -> Batcher:
    policy = env.policy or env.primary
    return Batcher(policy=policy, batch_size=env.batch_size, dedup_window=env.data.dedup_window,
                   ahead=env.data.batch_ahead)
