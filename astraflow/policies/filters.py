"""Group filters: the staleness filter and DAPO dynamic sampling (``groups → groups``)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from astraflow.core.records import Record, TrajectoryGroup
from astraflow.policies.base import Context, bump
from astraflow.policies.env import BuildEnv, reward_stats


class FilterState(msgspec.Struct, kw_only=True):
    counts: dict[str, int] = {}


class Staleness:
    """Drops (and counts) groups older than their policy's bound relative to that policy's
    trainer: ``version(p) - group.version > bound(p)`` for a group of policy ``p``.

    Each policy is judged by its own clock: ``ctx.version(p)`` is the newest version on
    ``weights.<p>`` and ``group.version`` the oldest version of any of p's tokens in the group,
    so a slow trainer of another policy neither ages nor rescues p's groups. ``bound(p)`` is
    ``per_policy[p]`` when given, else ``max_staleness`` (one policy: the old single bound).

    **The version vector.** A group of p produced in an episode where other policies acted
    (a solver's reward depends on the verifier that judged it) is also as stale as the
    oldest of those: for every other policy q of ``group.version_vector`` (the oldest
    version of q any member was produced under), ``version(q) - vector[q] > bound(q)``
    drops the group too, counted under ``stale:<q>``. p itself keeps the per-token rule
    above. A group without a vector (older records) is judged by the per-token rule only;
    a policy whose weights this stage does not read is at version 0 here, so it never
    ages a group (the batch stage reads only ``weights.<p>``; the post-rollout stage reads
    every policy's).

    A group with no generated token (``version == -1``) has no age by its own tokens. In
    ``post_rollout`` a dropped group's GroupStats says ``kept=False`` (the gate frees its
    slot); in ``batch`` the group already counted as accepted. Counts ``kept`` and
    ``dropped_stale`` (every drop), per policy ``dropped_stale.<p>`` when several policies
    have bounds, and ``stale:<q>`` for drops by another policy's age.
    """

    name = "staleness"
    consumes = TrajectoryGroup
    produces = TrajectoryGroup

    def __init__(self, *, max_staleness: int = 4,
                 per_policy: Mapping[str, int] | None = None) -> None:
        self.max_staleness = max_staleness
        self.per_policy = dict(per_policy or {})

    def bound(self, policy: str) -> int:
        """The staleness bound of ``policy``'s groups."""
        return self.per_policy.get(policy, self.max_staleness)

    def init_state(self) -> FilterState:
        return FilterState()

    def stale_by(self, g: TrajectoryGroup, ctx: Context) -> str | None:
        """Why ``g`` is too old: ``""`` by its own policy's tokens, ``q`` by another policy
        ``q`` of its version vector; None if it is fresh enough."""
        if g.version >= 0 and ctx.version(g.policy) - g.version > self.bound(g.policy):
            return ""
        for q, version in sorted(g.version_vector.items()):
            if q != g.policy and ctx.version(q) - version > self.bound(q):
                return q
        return None

    def process(self, g: TrajectoryGroup, state: FilterState, ctx: Context) -> list[Record]:
        by = self.stale_by(g, ctx)
        if by is None:
            bump(state.counts, "kept")
            return [g]
        bump(state.counts, "dropped_stale")
        if self.per_policy:
            bump(state.counts, f"dropped_stale.{g.policy}")
        if by:
            bump(state.counts, f"stale:{by}")
        return []

    def counters(self, state: FilterState) -> dict[str, int]:
        return dict(state.counts)


class DynamicSampling:
    """DAPO dynamic sampling: drops groups whose rewards are all equal (zero advantage).

    Counts ``generated`` (groups in), ``kept`` and ``dropped_easy`` / ``dropped_hard``. The
    flow it removes is made up for upstream: in ``post_rollout`` the chain marks a dropped
    group's GroupStats ``kept=False``, which gives the group's slot back to the gate, so the
    gate keeps releasing tasks until batches fill.
    """

    name = "dynamic_sampling"
    consumes = TrajectoryGroup
    produces = TrajectoryGroup

    def __init__(self, *, eps: float = 1e-6, easy_threshold: float = 0.5) -> None:
        self.eps = eps
        self.easy_threshold = easy_threshold

    def init_state(self) -> FilterState:
        return FilterState()

    def process(self, g: TrajectoryGroup, state: FilterState, ctx: Context) -> list[Record]:
        bump(state.counts, "generated")
        st = reward_stats(g.rewards(), eps=self.eps,
                          easy_threshold=self.easy_threshold)
        if st.zero_variance != "none":
            bump(state.counts, f"dropped_{st.zero_variance}")
            return []
        bump(state.counts, "kept")
        return [g]

    def counters(self, state: FilterState) -> dict[str, int]:
        return dict(state.counts)


def build_staleness(env: BuildEnv) -> Staleness:
    s = env.data.staleness.max_staleness
    return Staleness(max_staleness=env.data.max_staleness if s is None else s,
                     per_policy=env.data.max_staleness_per_policy)


def build_dynamic_sampling(env: BuildEnv) -> DynamicSampling:
    return DynamicSampling(eps=env.data.reward_eps, easy_threshold=env.data.easy_threshold)
