"""The group assembler on crafted trajectory streams (no bus)."""

from __future__ import annotations

import msgspec
import pytest
from policy_helpers import group_trajs, traj

from astraflow.core.records import GroupStats, Trajectory, TrajectoryGroup
from astraflow.policies.assembler import Assembler
from astraflow.policies.base import Context, PolicyError


def run(a: Assembler, records: list, ctx: Context | None = None, state=None):
    ctx = ctx or Context()
    state = state if state is not None else a.init_state()
    out = [o for r in records for o in a.process(r, state, ctx)]
    return out + a.tick(state, ctx), state


def groups_of(out: list) -> list[TrajectoryGroup]:
    return [o for o in out if isinstance(o, TrajectoryGroup)]


def stats_of(out: list) -> list[GroupStats]:
    return [o for o in out if isinstance(o, GroupStats)]


def test_complete_groups_with_stats_and_zero_variance_kinds() -> None:
    a = Assembler(group_size=4)
    records = (group_trajs("mixed#0", [1, 0, 1, 0]) + group_trajs("easy#0", [1, 1, 1, 1])
               + group_trajs("hard#0", [0, 0, 0, 0]))
    out, state = run(a, records)
    assert [g.group_id for g in groups_of(out)] == ["mixed#0", "easy#0", "hard#0"]
    kinds = {s.group_id: s.zero_variance for s in stats_of(out)}
    assert kinds == {"mixed#0": "none", "easy#0": "easy", "hard#0": "hard"}
    mixed = groups_of(out)[0]
    assert mixed.reward_mean == pytest.approx(0.5)
    assert mixed.reward_std == pytest.approx(0.5)  # population std
    assert [t.sample_index for t in mixed.trajectories] == [0, 1, 2, 3]
    assert state.counts["groups"] == 3 and not state.open


def test_group_waits_for_n_and_interleaves() -> None:
    a = Assembler(group_size=3)
    ga, gb = group_trajs("a#0", [1, 0, 1]), group_trajs("b#0", [0, 1, 1])
    out, state = run(a, [ga[0], gb[0], ga[1], gb[1], gb[2]])
    assert list(state.open) == ["default/a#0"]
    assert [g.group_id for g in groups_of(out)] == ["b#0"]
    out, _ = run(a, [ga[0], gb[0], ga[1], gb[1], gb[2], ga[2]])
    assert [g.group_id for g in groups_of(out)] == ["b#0", "a#0"]


def test_duplicates_and_late_trajectories_are_dropped() -> None:
    a = Assembler(group_size=2)
    g = group_trajs("a#0", [1, 0])
    out, state = run(a, [g[0], g[0], g[1], g[1]])
    assert len(groups_of(out)) == 1 and len(groups_of(out)[0].trajectories) == 2
    assert state.counts["duplicate"] == 2
    late, state = run(a, [g[1]], state=state)
    assert late == [] and state.counts["late"] == 1


def test_a_group_completes_on_n_samples_and_keeps_every_trajectory_of_each() -> None:
    a = Assembler(group_size=2)
    state = a.init_state()
    two = traj("a#0", 0, 1.0)
    extra = Trajectory(**{**msgspec.structs.asdict(two), "id": two.id + ".1", "reward": 0.0})
    for t in (two, traj("a#0", 1, 0.0)):
        assert a.process(t, state, Context()) == []  # complete, closed at the step's end
    assert a.process(extra, state, Context()) == []  # the last episode's other trajectory
    (g,) = groups_of(a.tick(state, Context()))
    assert sorted(t.id for t in g.trajectories) == sorted([two.id, extra.id, "default/a#0/1"])


def test_version_is_oldest_generated_token_and_stats_version_newest() -> None:
    a = Assembler(group_size=3)
    records = [traj("a#0", 0, 1.0, version=5), traj("a#0", 1, 0.0, version=3),
               traj("a#0", 2, 1.0, version=4)]
    out, _ = run(a, records)
    assert groups_of(out)[0].version == 3
    assert stats_of(out)[0].version == 5


def test_failed_trajectories_count_as_arrived_but_are_not_kept() -> None:
    a = Assembler(group_size=4, min_group_size=2)
    records = group_trajs("a#0", [1, 0, 1]) + [traj("a#0", 3, 0.0, finish="error")]
    out, state = run(a, records)
    (g,) = groups_of(out)
    assert len(g.trajectories) == 3 and state.counts["groups_partial"] == 1
    assert stats_of(out)[0].n == 3


def test_group_with_too_few_usable_trajectories_is_dropped_with_stats() -> None:
    a = Assembler(group_size=4, min_group_size=2)
    records = [traj("a#0", 0, 1.0)] + [traj("a#0", i, 0.0, finish="error") for i in (1, 2, 3)]
    out, state = run(a, records)
    assert groups_of(out) == [] and state.counts["dropped_incomplete"] == 1
    (s,) = stats_of(out)  # the gate still learns that the group came back
    assert s.n == 1


def test_timeout_closes_a_group_with_what_it_has() -> None:
    a = Assembler(group_size=4, min_group_size=2, timeout_s=10)
    state = a.init_state()
    ctx = Context(now=100.0)
    out, _ = run(a, group_trajs("a#0", [1, 0]) + group_trajs("b#0", [1]), ctx, state)
    assert out == []
    ctx.now = 109.9
    assert a.tick(state, ctx) == []
    ctx.now = 110.0
    out = a.tick(state, ctx)
    assert [g.group_id for g in groups_of(out)] == ["a#0"]  # b#0: 1 < min_group_size
    assert sorted(s.group_id for s in stats_of(out)) == ["a#0", "b#0"]
    assert state.counts["timed_out"] == 2 and state.counts["dropped_incomplete"] == 1
    late, _ = run(a, [traj("a#0", 2, 1.0)], ctx, state)
    assert late == [] and state.counts["late"] == 1


def test_min_group_size_is_capped_at_n() -> None:
    out, _ = run(Assembler(group_size=1, min_group_size=2), [traj("a#0", 0, 1.0)])
    assert len(groups_of(out)) == 1


def test_policies_are_separate_groups_and_unknown_policies_refused() -> None:
    a = Assembler(group_size=2, policies=("solver", "verifier"))
    records = (group_trajs("a#0", [1, 0], policy="solver")
               + group_trajs("a#0", [1, 1], policy="verifier"))
    out, _ = run(a, records)
    assert sorted((g.policy, g.group_id) for g in groups_of(out)) == [
        ("solver", "a#0"), ("verifier", "a#0")]
    with pytest.raises(PolicyError, match="policy 'judge'"):
        run(a, [traj("b#0", 0, 1.0, policy="judge")])


def test_on_the_bus_it_emits_references_not_copies() -> None:
    a = Assembler(group_size=2)
    state, ctx = a.init_state(), Context()
    ts = group_trajs("a#0", [1, 0])
    for i, t in enumerate(ts):
        ctx.origin = ("af.r.trajectories", 3, 100 + i)
        a.process(t, state, ctx)
    assert not state.open["default/a#0"].usable  # the state holds references only
    g = groups_of(a.tick(state, ctx))[0]
    assert not g.trajectories and g.ids() == [t.id for t in ts] and g.rewards() == [1.0, 0.0]
    assert [(r.topic, r.partition, r.offset) for r in g.refs] == [
        ("af.r.trajectories", 3, 100), ("af.r.trajectories", 3, 101)]
    assert g.version == run(Assembler(group_size=2), ts)[0][0].version  # same as from copies


def test_a_trajectory_without_a_group_size_needs_the_fallback() -> None:
    t = msgspec.structs.replace(traj("a#0", 0, 1.0), group_size=0)
    with pytest.raises(PolicyError, match="carries no group_size"):
        run(Assembler(), [t])
