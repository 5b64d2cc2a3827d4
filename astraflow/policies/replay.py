"""Replay (batch stage, right before the batcher): a share r of every batch is drawn from a
bounded buffer of past groups.

Batch i gets ``k_i = floor((i+1)·r·B) - floor(i·r·B)`` replayed groups, so the long-run
replayed fraction is exactly r. Candidates are buffered groups replayed fewer than
``max_uses`` times and at most ``max_staleness`` versions old; with too few, fresh groups fill
the slots. Selection is ``recent`` or ``advantage`` (weighted by mean |reward - group mean|,
with counter-based randomness, so a restarted run picks the same). Replayed groups carry
``replayed=True``. See docs/policies.md.
"""

from __future__ import annotations

import math

import msgspec

from astraflow.core.records import Record, TrajectoryGroup
from astraflow.policies.base import Context, bump, group_key, remember, uniform
from astraflow.policies.env import BuildEnv


class ReplayState(msgspec.Struct, kw_only=True):
    buffer: list[TrajectoryGroup] = []  # oldest first
    uses: dict[str, int] = {}
    block: list[str] = []  # group ids of the batch being filled
    block_replays: int = 0
    batch_index: int = 0
    seen: dict[str, int] = {}  # recent fresh group ids
    counts: dict[str, int] = {}


def priority(g: TrajectoryGroup) -> float:
    """Mean |advantage| of a group, advantage = reward - group mean."""
    rewards = g.rewards()
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return sum(abs(r - mean) for r in rewards) / len(rewards)


class Replay:
    name = "replay"
    levels = frozenset({"buffered"})  # current values (gauges), not counts
    consumes = TrajectoryGroup
    produces = TrajectoryGroup

    def __init__(self, *, batch_size: int, ratio: float = 0.25, capacity: int = 256,
                 selection: str = "recent", max_staleness: int = 8, max_uses: int = 1,
                 policy: str = "default", seed: int = 0, dedup_window: int = 10_000) -> None:
        if selection not in ("recent", "advantage"):
            raise ValueError(f"unknown replay selection {selection!r}; valid: recent, advantage")
        self.batch_size = batch_size
        self.ratio = ratio
        self.capacity = capacity
        self.selection = selection
        self.max_staleness = max_staleness
        self.max_uses = max_uses
        self.policy = policy
        self.seed = seed
        self.dedup_window = dedup_window

    def init_state(self) -> ReplayState:
        return ReplayState()

    def replays_in(self, batch_index: int) -> int:
        """k_i, the replayed groups batch ``batch_index`` should hold."""
        rb = self.ratio * self.batch_size
        return (math.floor((batch_index + 1) * rb + 1e-9)
                - math.floor(batch_index * rb + 1e-9))

    def process(self, g: TrajectoryGroup, state: ReplayState, ctx: Context) -> list[Record]:
        if not remember(state.seen, group_key(g), self.dedup_window):
            bump(state.counts, "duplicate")
            return []
        bump(state.counts, "fresh")
        state.block.append(group_key(g))
        state.buffer.append(g)
        state.uses[group_key(g)] = 0
        while len(state.buffer) > self.capacity:
            old = state.buffer.pop(0)
            state.uses.pop(group_key(old), None)
            bump(state.counts, "evicted_capacity")
        out: list[Record] = [g]
        out.extend(self._fill(state, ctx))
        if len(state.block) >= self.batch_size:
            state.batch_index += 1
            state.block = []
            state.block_replays = 0
        return out

    def _fill(self, state: ReplayState, ctx: Context) -> list[Record]:
        need = self.replays_in(state.batch_index) - state.block_replays
        slots = self.batch_size - len(state.block)
        if need <= 0 or slots <= 0 or slots > need:
            return []
        picked = self._select(state, ctx, slots)
        out: list[Record] = []
        for g in picked:
            state.block.append(group_key(g))
            state.block_replays += 1
            state.uses[group_key(g)] += 1
            if state.uses[group_key(g)] >= self.max_uses:
                state.buffer.remove(g)
                del state.uses[group_key(g)]
            bump(state.counts, "replayed")
            out.append(msgspec.structs.replace(g, replayed=True))
        return out

    def _select(self, state: ReplayState, ctx: Context, k: int) -> list[TrajectoryGroup]:
        version = ctx.version(self.policy)
        fresh_enough = []
        for g in state.buffer:
            if g.version >= 0 and version - g.version > self.max_staleness:
                bump(state.counts, "evicted_stale")
                state.uses.pop(group_key(g), None)
                continue
            fresh_enough.append(g)
        state.buffer = fresh_enough
        block = set(state.block)
        cands = [g for g in state.buffer if group_key(g) not in block]
        if self.selection == "recent":
            return cands[::-1][:k]
        # Efraimidis-Spirakis: key = u^(1/w); the k largest keys are a weighted sample.
        keyed = []
        for g in cands:
            w = priority(g) + 1e-9
            u = uniform(self.seed, "replay", self.policy, state.batch_index, group_key(g))
            keyed.append((math.log(max(u, 1e-300)) / w, group_key(g), g))
        keyed.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return [g for _, _, g in keyed[:k]]

    def counters(self, state: ReplayState) -> dict[str, int]:
        return {**state.counts, "buffered": len(state.buffer)}


def build(env: BuildEnv) -> Replay:
    r = env.data.replay
    return Replay(batch_size=env.batch_size, ratio=r.ratio, capacity=r.capacity,
                  selection=r.selection, max_staleness=r.max_staleness, max_uses=r.max_uses,
                  policy=env.policy or env.primary, seed=env.seed,
                  dedup_window=env.data.dedup_window)
