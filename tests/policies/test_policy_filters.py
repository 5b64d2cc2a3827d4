"""Staleness filter and DAPO dynamic sampling on crafted group streams."""

from __future__ import annotations

import pytest
from policy_helpers import group_trajs, tgroup

from astraflow.core.records import GroupStats, TrajectoryGroup
from astraflow.policies.assembler import Assembler
from astraflow.policies.base import Context
from astraflow.policies.chain import Chain
from astraflow.policies.filters import DynamicSampling, FilterState, Staleness


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
