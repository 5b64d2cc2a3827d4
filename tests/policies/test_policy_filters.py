"""Staleness filter and DAPO dynamic sampling on crafted group streams."""

from __future__ import annotations

import pytest
from policy_helpers import group_trajs, tgroup

from astraflow.core.records import GroupStats, TrajectoryGroup
from astraflow.policies.assembler import Assembler
from astraflow.policies.base import Context
from astraflow.policies.chain import Chain
from astraflow.policies.config import DataConfig
from astraflow.policies.env import BuildEnv
from astraflow.policies.filters import DynamicSampling, FilterState, Staleness, build_staleness
from astraflow.policies.gate import build as build_gate


def test_dynamic_sampling_keeps_exactly_the_mixed_groups() -> None:
    ds = DynamicSampling(eps=1e-6, easy_threshold=0.5)
    state = ds.init_state()
    groups = [tgroup("mix1", [1, 0, 1, 1]), tgroup("easy", [1, 1, 1, 1]),
              tgroup("hard", [0, 0, 0, 0]), tgroup("mix2", [0.2, 0.2, 0.2, 0.3]),
              tgroup("near", [0.5, 0.5 + 1e-9, 0.5, 0.5]), tgroup("neg", [-1, -1])]
    kept = [o.group_id for g in groups for o in ds.process(g, state, Context())]
    assert kept == ["mix1", "mix2"]
    assert state.counts == {"generated": 6, "kept": 2, "dropped_easy": 2, "dropped_hard": 2}


def test_staleness_drops_and_counts_groups_older_than_the_bound() -> None:
    f = Staleness(max_staleness=2)
    state = f.init_state()
    ctx = Context(versions={"default": 10, "other": 3})
    groups = [tgroup("v8", [1, 0], version=8), tgroup("v7", [1, 0], version=7),
              tgroup("v10", [1, 0], version=10), tgroup("other", [1, 0], version=1,
                                                         policy="other")]
    kept = [o.group_id for g in groups for o in f.process(g, state, ctx)]
    assert kept == ["v8", "v10", "other"]
    assert state.counts == {"kept": 3, "dropped_stale": 1}
    # no version published yet: everything is at version 0
    assert f.process(tgroup("x", [1, 0], version=0), state, Context()) != []


def test_each_policy_is_judged_by_its_own_version_and_its_own_bound() -> None:
    f = Staleness(max_staleness=2, per_policy={"verifier": 6})
    state = f.init_state()
    # the verifier's trainer is far ahead of the solver's: that must not age solver groups
    ctx = Context(versions={"solver": 10, "verifier": 20})
    groups = [tgroup("s8", [1, 0], version=8, policy="solver"),      # 2 behind: kept
              tgroup("s7", [1, 0], version=7, policy="solver"),      # 3 > 2: dropped
              tgroup("v14", [1, 0], version=14, policy="verifier"),  # 6 behind: kept
              tgroup("v13", [1, 0], version=13, policy="verifier"),  # 7 > 6: dropped
              tgroup("v-1", [1, 0], version=-1, policy="verifier")]  # no token: no age
    kept = [o.group_id for g in groups for o in f.process(g, state, ctx)]
    assert kept == ["s8", "v14", "v-1"]
    assert (f.bound("solver"), f.bound("verifier")) == (2, 6)
    assert state.counts == {"kept": 3, "dropped_stale": 2, "dropped_stale.solver": 1,
                            "dropped_stale.verifier": 1}


@pytest.mark.parametrize("data,bounds", [
    ({}, (4, 4)),  # the defaults: one bound, data.max_staleness
    ({"max_staleness": 3}, (3, 3)),
    ({"staleness": {"max_staleness": 1}}, (1, 1)),
    ({"max_staleness_per_policy": {"verifier": 9}}, (4, 9)),
    # the policy's own entry is the most specific key and wins over the stage's
    ({"staleness": {"max_staleness": 1}, "max_staleness_per_policy": {"verifier": 9}},
     (1, 9)),
])
def test_the_built_filter_takes_each_policys_bound_from_data(data: dict, bounds: tuple
                                                             ) -> None:
    f = build_staleness(BuildEnv(data=DataConfig(**data), stage="post_rollout",
                                 policies=("solver", "verifier"), primary="solver"))
    assert (f.bound("solver"), f.bound("verifier")) == bounds


@pytest.mark.parametrize("data,bound", [
    ({}, 4),
    ({"gate": {"max_staleness": 2}}, 2),
    ({"max_staleness_per_policy": {"verifier": 9}}, 4),  # not the primary: not the gate's
    ({"gate": {"max_staleness": 2}, "max_staleness_per_policy": {"solver": 7}}, 7),
])
def test_the_gate_follows_the_primary_policys_bound(data: dict, bound: int) -> None:
    gate = build_gate(BuildEnv(data=DataConfig(**data), stage="pre_rollout",
                               policies=("solver", "verifier"), primary="solver"))
    assert gate.max_staleness == bound


def test_a_two_policy_post_rollout_stage_filters_each_policy_by_its_bound() -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=2, min_group_size=2)),
                                   ("staleness", Staleness(max_staleness=1,
                                                           per_policy={"verifier": 3}))])
    chain.set_version("solver", 5)
    chain.set_version("verifier", 5)
    records = [t for p in ("solver", "verifier") for v in (4, 3, 2)
               for t in group_trajs(f"{p}-v{v}#0", [1, 0], version=v, policy=p)]
    out = chain.run(records)
    assert sorted(o.group_id for o in out if isinstance(o, TrajectoryGroup)) == [
        "solver-v4#0", "verifier-v2#0", "verifier-v3#0", "verifier-v4#0"]
    assert stats_kept(out) == {"solver-v4#0": True, "solver-v3#0": False,
                               "solver-v2#0": False, "verifier-v4#0": True,
                               "verifier-v3#0": True, "verifier-v2#0": True}


def stats_kept(out: list) -> dict[str, bool]:
    return {o.group_id: o.kept for o in out if isinstance(o, GroupStats)}


def test_groupstats_say_whether_the_post_rollout_stage_kept_the_group() -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=2, min_group_size=2)),
                                   ("staleness", Staleness(max_staleness=1)),
                                   ("dynamic_sampling", DynamicSampling())])
    chain.set_version("default", 5)
    records = (group_trajs("mixed#0", [1, 0], version=5)
               + group_trajs("easy#0", [1, 1], version=5)
               + group_trajs("stale#0", [1, 0], version=3)
               + group_trajs("cut#0", [1, 0], version=5, finish="error"))  # nothing usable
    out = chain.run(records)
    assert [o.group_id for o in out if isinstance(o, TrajectoryGroup)] == ["mixed#0"]
    # dropped by dynamic sampling, the staleness filter and the assembler (no usable sample)
    assert stats_kept(out) == {"mixed#0": True, "easy#0": False, "stale#0": False,
                               "cut#0": False}


class Hold:
    """A post-rollout policy that keeps every group one step (released by ``tick``)."""

    name = "hold"
    consumes = TrajectoryGroup
    produces = TrajectoryGroup

    def __init__(self, declared: bool) -> None:
        self.holds_groups = declared

    def init_state(self) -> FilterState:
        return FilterState()

    def process(self, g: TrajectoryGroup, state: FilterState, ctx: Context) -> list:
        state.counts[g.group_id] = 1
        return []

    def tick(self, state: FilterState, ctx: Context) -> list:
        return []


@pytest.mark.parametrize("declared", [True, False])
def test_a_policy_that_holds_groups_must_say_so(declared: bool) -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=2)),
                                   ("hold", Hold(declared))])
    out = chain.run(group_trajs("a#0", [1, 0]))
    # declared: the held group counts as kept (its gate slot stays taken); not declared:
    # a group process() did not return is taken as dropped
    assert stats_kept(out) == {"a#0": declared}
