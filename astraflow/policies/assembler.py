"""Group assembler (post-rollout, ``trajectories → groups``).

Collects the trajectories of the n samples of each (policy, agent, group id) and emits one
TrajectoryGroup, plus a GroupStats on ``stats`` for every closed group, kept or dropped (GRESO's
feedback, the gate's accounting). n is ``Trajectory.group_size``, else ``assembler.group_size``.
A group closes when n distinct samples have arrived or ``timeout_s`` after its first; failed
trajectories count as arrived but are never trained on. On the bus it keeps and emits
references (:class:`TrajRef`), not copies. The incomplete-group rule: docs/policies.md.
"""

from __future__ import annotations

import msgspec

from astraflow.core.records import GroupStats, Record, Trajectory, TrajectoryGroup, TrajRef
from astraflow.policies.base import Context, PolicyError, bump, remember
from astraflow.policies.env import BuildEnv, reward_stats, token_versions


def group_key(policy: str, agent: str, group_id: str) -> str:
    """The assembler's key of a group: ``policy/group_id``, or ``policy:agent/group_id``
    for a role's group (the agent-less form is the one checkpoints held before agents)."""
    return f"{policy}:{agent}/{group_id}" if agent else f"{policy}/{group_id}"


def oldest_vector(acc: dict[str, int], vector: dict[str, int]) -> dict[str, int]:
    """``acc`` with every policy of ``vector`` at the older of the two versions."""
    if not vector:
        return acc
    out = dict(acc)
    for policy, version in vector.items():
        out[policy] = min(out.get(policy, version), version)
    return out


class OpenGroup(msgspec.Struct, kw_only=True):
    policy: str
    group_id: str
    task_id: str
    first_seen: float
    expected: int
    arrived: list[str] = []  # trajectory ids
    samples: list[int] = []  # distinct sample indices
    usable: list[Trajectory] = []  # copies, where the records have no bus position
    refs: list[TrajRef] = []  # references to the usable records on the bus
    oldest: int = -1  # policy versions of the usable records' generated tokens
    newest: int = -1
    agent: str = ""
    vector: dict[str, int] = {}  # the usable records' oldest vector (see oldest_vector)


class AssemblerState(msgspec.Struct, kw_only=True):
    open: dict[str, OpenGroup] = {}  # group_key(), in order of first arrival
    complete: dict[str, int] = {}  # keys of open groups that have all their samples
    closed: dict[str, int] = {}  # recently closed keys (bounded)
    counts: dict[str, int] = {}


class Assembler:
    """See the module docstring for the rules."""

    name = "assembler"
    levels = frozenset({"open"})  # current values (gauges), not counts
    consumes = Trajectory
    produces = TrajectoryGroup

    def __init__(self, *, group_size: int | None = None, min_group_size: int = 2,
                 timeout_s: float = 600.0,
                 failed_reasons: tuple[str, ...] = ("error", "timeout", "aborted", "abandoned"),
                 policies: tuple[str, ...] = (), eps: float = 1e-6, easy_threshold: float = 0.5,
                 dedup_window: int = 10_000) -> None:
        self.group_size = group_size
        self.min_group_size = min_group_size
        self.timeout_s = timeout_s
        self.failed_reasons = frozenset(failed_reasons)
        self.policies = frozenset(policies)
        self.eps = eps
        self.easy_threshold = easy_threshold
        self.dedup_window = dedup_window

    def init_state(self) -> AssemblerState:
        return AssemblerState()

    def process(self, t: Trajectory, state: AssemblerState, ctx: Context) -> list[Record]:
        if self.policies and t.policy not in self.policies:
            raise PolicyError(f"trajectory {t.id!r} is for policy {t.policy!r}, which is not one "
                              f"of this run's policies ({', '.join(sorted(self.policies))}); "
                              "add it to `policies` in the config")
        key = group_key(t.policy, t.agent, t.group_id)
        if key in state.closed:
            bump(state.counts, "late")
            return []
        g = state.open.get(key)
        if g is None:
            expected = getattr(t, "group_size", 0) or self.group_size
            if not expected:
                raise PolicyError(f"trajectory {t.id!r} carries no group_size and "
                                  "data.assembler.group_size is not set: set it to the tasks' "
                                  "n_samples")
            g = state.open[key] = OpenGroup(policy=t.policy, agent=t.agent,
                                            group_id=t.group_id, task_id=t.task_id,
                                            first_seen=ctx.now, expected=expected)
        if t.id in g.arrived:
            bump(state.counts, "duplicate")
            return []
        g.arrived.append(t.id)
        bump(state.counts, "trajectories")
        if t.finish_reason in self.failed_reasons:
            bump(state.counts, "failed")
        else:
            self._keep(t, g, ctx)
        if t.sample_index not in g.samples:
            g.samples.append(t.sample_index)
            if len(g.samples) >= g.expected:
                state.complete[key] = 1
        return []

    @staticmethod
    def _keep(t: Trajectory, g: OpenGroup, ctx: Context) -> None:
        """Add a usable trajectory to its open group: a copy, or a reference on the bus."""
        g.vector = oldest_vector(g.vector, t.version_vector)
        if ctx.origin is None:
            g.usable.append(t)
            return
        topic, partition, offset = ctx.origin
        g.refs.append(TrajRef(t.id, topic, partition, offset, t.sample_index, t.reward))
        lo, hi = token_versions([t])
        if lo >= 0:
            g.oldest = lo if g.oldest < 0 else min(g.oldest, lo)
            g.newest = max(g.newest, hi)

    def tick(self, state: AssemblerState, ctx: Context) -> list[Record]:
        out: list[Record] = []
        for key in list(state.complete):
            out.extend(self._close(key, state))
        for key in list(state.open):  # oldest first
            if ctx.now - state.open[key].first_seen < self.timeout_s:
                break
            bump(state.counts, "timed_out")
            out.extend(self._close(key, state))
        return out

    def _close(self, key: str, state: AssemblerState) -> list[Record]:
        g = state.open.pop(key)
        state.complete.pop(key, None)
        remember(state.closed, key, self.dedup_window)
        usable = sorted(g.usable, key=lambda t: (t.sample_index, t.id))
        refs = sorted(g.refs, key=lambda r: (r.sample_index, r.id))
        st = reward_stats([t.reward for t in (refs or usable)], eps=self.eps,
                          easy_threshold=self.easy_threshold)
        oldest, newest = token_versions(usable) if usable else (g.oldest, g.newest)
        stats = GroupStats(task_id=g.task_id, group_id=g.group_id, policy=g.policy,
                           agent=g.agent, n=st.n,
                           reward_mean=st.mean, reward_std=st.std,
                           zero_variance=st.zero_variance, version=newest, kept=True)
        if st.n == 0 or st.n < min(self.min_group_size, g.expected):
            bump(state.counts, "dropped_incomplete")
            stats.kept = False
            return [stats]
        bump(state.counts, "groups")
        if st.n < g.expected:
            bump(state.counts, "groups_partial")
        group = TrajectoryGroup(group_id=g.group_id, task_id=g.task_id, policy=g.policy,
                                agent=g.agent, refs=refs, trajectories=usable,
                                reward_mean=st.mean, reward_std=st.std, version=oldest,
                                version_vector=dict(g.vector))
        return [group, stats]

    def counters(self, state: AssemblerState) -> dict[str, int]:
        return {**state.counts, "open": len(state.open)}


def build(env: BuildEnv) -> Assembler:
    a = env.data.assembler
    return Assembler(group_size=a.group_size, min_group_size=a.min_group_size,
                     timeout_s=a.timeout_s, failed_reasons=tuple(a.failed_reasons),
                     policies=env.policies, eps=env.data.reward_eps,
                     easy_threshold=env.data.easy_threshold, dedup_window=env.data.dedup_window)
