"""Staleness capacity gate (pre-rollout): the system's backpressure.

Releases tasks only while the work started stays within ``max_staleness`` versions of the
trainer (AReaL's rule)::

    started <= (max_staleness + version + 1) * batch_size
    started = in_flight + accepted

``version`` and ``batch_size`` are the primary policy's. A released group is in flight until
its one GroupStats comes back on ``stats``, then accepted (``kept``) or given back; one not
back within ``lost_after_s`` is written off. Tasks that do not fit wait in order, and while
any wait the stage reads no more input. Details: docs/policies.md.
"""

from __future__ import annotations

import msgspec

from astraflow.core.records import GroupStats, Record, Task
from astraflow.policies.base import Context, bump, remember
from astraflow.policies.env import BuildEnv


class GateState(msgspec.Struct, kw_only=True):
    held: list[Task] = []
    in_flight: dict[str, float] = {}  # group id -> release time, in release order
    in_transit: int = 0  # passed by the gate in the current step, not yet out of the stage
    accepted: int = 0
    lost_ids: dict[str, int] = {}  # recently written-off groups (their stats may still come)
    counts: dict[str, int] = {}


class Gate:
    name = "gate"
    levels = frozenset({"waiting", "in_flight", "started"})  # current values (gauges), not counts
    consumes = Task
    produces = Task
    wants = frozenset({"stats"})

    def __init__(self, *, primary: str = "default", batch_size: int = 8,
                 max_staleness: int = 4, lost_after_s: float = 3600.0,
                 dedup_window: int = 10_000) -> None:
        self.primary = primary
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.lost_after_s = lost_after_s
        self.dedup_window = dedup_window

    def init_state(self) -> GateState:
        return GateState()

    def capacity(self, ctx: Context) -> int:
        return (self.max_staleness + ctx.version(self.primary) + 1) * self.batch_size

    def started(self, state: GateState) -> int:
        return len(state.in_flight) + state.in_transit + state.accepted

    def _fits(self, state: GateState, ctx: Context) -> bool:
        return self.started(state) < self.capacity(ctx)

    def process(self, task: Task, state: GateState, ctx: Context) -> list[Record]:
        if state.held or not self._fits(state, ctx):
            state.held.append(task)
            bump(state.counts, "held")
            return []
        state.in_transit += 1
        return [task]

    def tick(self, state: GateState, ctx: Context) -> list[Record]:
        for gid in list(state.in_flight):  # oldest first
            if ctx.now - state.in_flight[gid] < self.lost_after_s:
                break
            del state.in_flight[gid]
            remember(state.lost_ids, gid, self.dedup_window)
            bump(state.counts, "lost")
        out: list[Record] = []
        while state.held and self._fits(state, ctx):
            out.append(state.held.pop(0))
            state.in_transit += 1
        return out

    def on_emitted(self, records: list[Record], state: GateState, ctx: Context) -> None:
        state.in_transit = 0
        for r in records:
            if isinstance(r, Task):
                state.in_flight[r.resolved_group_id()] = ctx.now
                bump(state.counts, "released")

    def on_stats(self, st: GroupStats, state: GateState, ctx: Context) -> None:
        if st.policy != self.primary:
            return
        if state.in_flight.pop(st.group_id, None) is not None:
            bump(state.counts, "closed")
        elif state.lost_ids.pop(st.group_id, None) is not None:
            bump(state.counts, "late")
        else:  # not ours, or a redelivery of stats already counted
            return
        if st.kept:
            state.accepted += 1
        else:
            bump(state.counts, "dropped")

    def ready(self, state: GateState) -> bool:
        return not state.held

    def counters(self, state: GateState) -> dict[str, int]:
        return {**state.counts, "waiting": len(state.held), "in_flight": len(state.in_flight),
                "accepted": state.accepted, "started": self.started(state)}


def build(env: BuildEnv) -> Gate:
    s = env.data.gate.max_staleness
    return Gate(primary=env.primary, batch_size=env.data.batch_size_of(env.primary),
                max_staleness=env.data.max_staleness_of(env.primary, s),
                lost_after_s=env.data.gate.lost_after_s, dedup_window=env.data.dedup_window)
