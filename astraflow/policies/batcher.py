"""Batcher (batch stage, last): batches of B whole groups for one policy.

Batch ids are ``f"{policy}-{seq}"`` with ``seq`` counting from 0, so a batch produced twice
(a crash between produce and checkpoint) is recognisable by id. A fresh group is put in a
batch at most once (recent group ids are remembered); a replayed group may come again, but
never twice in the same batch.
"""

from __future__ import annotations

import msgspec

from astraflow.core.records import Batch, Group, Record, TrajectoryGroup
from astraflow.policies.base import Context, PolicyError, bump, group_key, remember
from astraflow.policies.env import BuildEnv


class BatcherState(msgspec.Struct, kw_only=True):
    pending: list[TrajectoryGroup] = []
    seq: int = 0
    seen: dict[str, int] = {}
    counts: dict[str, int] = {}


class Batcher:
    name = "batcher"
    levels = frozenset({"pending"})  # current values (gauges), not counts
    consumes = TrajectoryGroup
    produces = Batch

    def __init__(self, *, policy: str, batch_size: int, dedup_window: int = 10_000) -> None:
        self.policy = policy
        self.batch_size = batch_size
        self.dedup_window = dedup_window

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
        if len(state.pending) < self.batch_size:
            return []
        batch = Batch(id=f"{self.policy}-{state.seq}", policy=self.policy, seq=state.seq,
                      groups=[Group(group_id=p.group_id, task_id=p.task_id, refs=p.refs,
                                    trajectories=p.trajectories, replayed=p.replayed)
                              for p in state.pending])
        state.seq += 1
        state.pending = []
        bump(state.counts, "batches")
        return [batch]

    def counters(self, state: BatcherState) -> dict[str, int]:
        return {**state.counts, "pending": len(state.pending)}


def build(env: BuildEnv) -> Batcher:
    policy = env.policy or env.primary
    return Batcher(policy=policy, batch_size=env.batch_size, dedup_window=env.data.dedup_window)
