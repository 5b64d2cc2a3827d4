"""Staleness filter and DAPO dynamic sampling on crafted group streams."""

from __future__ import annotations

from policy_helpers import tgroup

from astraflow.policies.base import Context
from astraflow.policies.filters import DynamicSampling, Staleness


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
