"""One policy playing two roles: its two groups of a task (same group id, two agents) are two
groups in the batch stage and in the chain's kept/dropped settlement, not duplicates."""

from __future__ import annotations

import msgspec
from policy_helpers import tgroup, traj

from astraflow.core.records import Batch, GroupStats, TrajectoryGroup
from astraflow.policies.assembler import Assembler
from astraflow.policies.base import Context
from astraflow.policies.batcher import Batcher
from astraflow.policies.chain import Chain
from astraflow.policies.filters import DynamicSampling
from astraflow.policies.replay import Replay


def roles(gid: str) -> list[TrajectoryGroup]:
    return [msgspec.structs.replace(tgroup(gid, [1, 0]), agent="solver"),
            msgspec.structs.replace(tgroup(gid, [0, 1]), agent="verifier")]


def test_the_batcher_batches_both_roles_groups_of_a_task() -> None:
    b = Batcher(policy="default", batch_size=2)
    state = b.init_state()
    out = [o for g in roles("a#0") for o in b.process(g, state, Context())]
    (batch,) = out
    assert isinstance(batch, Batch) and len(batch.groups) == 2
    # a redelivered role group is still a duplicate
    assert b.process(roles("a#0")[1], state, Context()) == []
    assert state.counts["duplicate"] == 1


def test_replay_takes_both_roles_groups_as_fresh() -> None:
    r = Replay(batch_size=4, ratio=0.0, policy="default")
    state = r.init_state()
    out = [o for g in roles("a#0") for o in r.process(g, state, Context())]
    assert [g.agent for g in out] == ["solver", "verifier"]
    assert state.counts == {"fresh": 2}


def test_a_dropped_roles_group_marks_only_its_own_stats_not_kept() -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=2)),
                                   ("dynamic_sampling", DynamicSampling())])
    records = []
    for i, (rs, rv) in enumerate([(1.0, 1.0), (0.0, 1.0)]):
        for agent, rew in (("solver", rs), ("verifier", rv)):
            t = traj("a#0", i, rew)
            records.append(msgspec.structs.replace(t, agent=agent, id=f"{t.id}@{agent}",
                                                   group_size=2))
    out = chain.run(records)
    assert [g.agent for g in out if isinstance(g, TrajectoryGroup)] == ["solver"]
    assert {s.agent: s.kept for s in out if isinstance(s, GroupStats)} == {
        "solver": True, "verifier": False}
