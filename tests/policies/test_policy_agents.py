"""Agent-wise groups: one policy playing two roles has one group (one normalisation) per role
per task, through the assembler, the staleness filter's chain and the trainer's advantages."""

from __future__ import annotations

import msgspec
import pytest
from policy_helpers import traj

from astraflow.core.records import Batch, Group, GroupStats, Trajectory, TrajectoryGroup
from astraflow.policies.assembler import Assembler, AssemblerState
from astraflow.policies.base import Context
from astraflow.policies.chain import Chain
from astraflow.policies.filters import DynamicSampling


def role(t: Trajectory, agent: str, n: int = 4) -> Trajectory:
    """``t`` as the trajectory of role ``agent`` in groups of ``n`` (its id made unique per
    role, as the worker's ``.k`` suffix does)."""
    return msgspec.structs.replace(t, agent=agent, id=f"{t.id}@{agent}", group_size=n)


def episodes(gid: str, solver: list[float], verifier: list[float]) -> list[Trajectory]:
    """One policy ("default") plays both roles: per sample, a solver and a verifier record,
    in the order a worker writes them."""
    out = []
    for i, (rs, rv) in enumerate(zip(solver, verifier, strict=True)):
        out += [role(traj(gid, i, rs), "solver"), role(traj(gid, i, rv), "verifier")]
    return out


def run(a: Assembler, records: list[Trajectory], state: AssemblerState | None = None
        ) -> tuple[list, AssemblerState]:
    state = state if state is not None else a.init_state()
    ctx = Context()
    out = [o for r in records for o in a.process(r, state, ctx)]
    return out + a.tick(state, ctx), state


def by_agent(out: list) -> dict[tuple[str, str], TrajectoryGroup]:
    groups = [o for o in out if isinstance(o, TrajectoryGroup)]
    keyed = {(g.group_id, g.agent): g for g in groups}
    assert len(keyed) == len(groups)
    return keyed


def test_one_policy_two_roles_gives_two_groups_per_task_each_normalised_on_its_own() -> None:
    a = Assembler(group_size=4)
    out, state = run(a, episodes("a#0", [1, 0, 1, 0], [1, 1, 1, 0]))
    groups = by_agent(out)
    assert sorted(groups) == [("a#0", "solver"), ("a#0", "verifier")]
    solver, verifier = groups["a#0", "solver"], groups["a#0", "verifier"]
    assert {t.agent for t in solver.trajectories} == {"solver"}
    assert {t.agent for t in verifier.trajectories} == {"verifier"}
    assert [t.sample_index for t in verifier.trajectories] == [0, 1, 2, 3]
    assert (solver.reward_mean, solver.reward_std) == pytest.approx((0.5, 0.5))
    assert (verifier.reward_mean, verifier.reward_std) == pytest.approx((0.75, 0.4330127))
    stats = {(s.group_id, s.agent): s for s in out if isinstance(s, GroupStats)}
    assert sorted(stats) == [("a#0", "solver"), ("a#0", "verifier")]
    assert stats["a#0", "verifier"].n == 4 and stats["a#0", "verifier"].policy == "default"
    assert state.counts == {"trajectories": 8, "groups": 2}


def test_mixed_tasks_roles_and_agentless_records_keep_their_own_groups() -> None:
    a = Assembler(group_size=4)
    records = (episodes("a#0", [1, 0, 1, 0], [0, 0, 0, 0])
               + [role(traj("b#0", i, r), "solver") for i, r in enumerate([1, 1, 0, 0])]
               + [msgspec.structs.replace(traj("c#0", i, r), group_size=4)  # older records
                  for i, r in enumerate([1, 0, 0, 0])]
               + [role(traj("b#0", i, r), "verifier") for i, r in enumerate([1, 0, 1, 1])])
    out, state = run(a, records)
    groups = by_agent(out)
    assert sorted(groups) == [("a#0", "solver"), ("a#0", "verifier"), ("b#0", "solver"),
                              ("b#0", "verifier"), ("c#0", "")]
    assert groups["c#0", ""].reward_mean == pytest.approx(0.25)
    assert groups["b#0", "verifier"].reward_mean == pytest.approx(0.75)
    assert groups["b#0", "solver"].reward_mean == pytest.approx(0.5)
    # a role's group is complete on its own samples: the verifier's four closed b#0's
    assert not state.open and state.counts["groups"] == 5


def test_a_role_waits_for_its_own_samples() -> None:
    a = Assembler(group_size=2)
    state = a.init_state()
    solver = [role(traj("a#0", i, 1.0 - i), "solver", 2) for i in (0, 1)]
    verifier = role(traj("a#0", 0, 1.0), "verifier", 2)
    out, state = run(a, [*solver, verifier], state)
    assert sorted(by_agent(out)) == [("a#0", "solver")]  # the verifier's group is open
    assert list(state.open) == ["default:verifier/a#0"]
    out, state = run(a, [role(traj("a#0", 1, 0.0), "verifier", 2)], state)
    assert sorted(by_agent(out)) == [("a#0", "verifier")]
    # a redelivered record is a duplicate of its role's group, late after it closed
    late, state = run(a, [solver[0]], state)
    assert late == [] and state.counts["late"] == 1


def test_dynamic_sampling_drops_one_roles_group_and_keeps_the_other() -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=4)),
                                   ("dynamic_sampling", DynamicSampling())])
    out = chain.run(episodes("a#0", [1, 0, 1, 0], [1, 1, 1, 1]))
    assert [(g.agent, g.group_id) for g in out if isinstance(g, TrajectoryGroup)] == [
        ("solver", "a#0")]


def test_the_trainer_normalises_each_roles_group_apart() -> None:
    """A batch holding a task's solver group and verifier group: the trainer's advantages
    are each group's own (the verifier's all-equal rewards give it zero advantages, which a
    pooled group of 8 would not)."""
    from astraflow.consumers.trainer.batching import prepare

    out, _ = run(Assembler(group_size=4), episodes("a#0", [1, 0, 1, 0], [1, 1, 1, 1]))
    groups = by_agent(out)
    batch = Batch(id="default-0", policy="default", seq=0, groups=[
        Group(group_id=g.group_id, task_id=g.task_id, trajectories=g.trajectories)
        for g in (groups["a#0", "solver"], groups["a#0", "verifier"])])
    prep = prepare(batch, advantages=True, std_norm=True)
    adv = [s.advantage for s in prep.seqs]
    assert len(adv) == 8 and prep.stats["groups_zero_adv"] == 1
    std = (4 / 3 * 0.25) ** 0.5  # the solver's unbiased std
    assert adv[:4] == pytest.approx([0.5 / std, -0.5 / std, 0.5 / std, -0.5 / std], rel=1e-4)
    assert adv[4:] == [0.0] * 4


def test_the_group_records_each_policys_oldest_version_vector_entry() -> None:
    a = Assembler(group_size=2)
    ts = [msgspec.structs.replace(traj("a#0", i, float(i), policy="solver"), group_size=2,
                                  version_vector=v)
          for i, v in enumerate([{"solver": 5, "verifier": 9}, {"solver": 6, "verifier": 7}])]
    (g,) = [o for o in run(a, ts)[0] if isinstance(o, TrajectoryGroup)]
    assert g.version_vector == {"solver": 5, "verifier": 7}
    # on the bus (references, no copies) the vector is the same
    state, ctx = a.init_state(), Context()
    for i, t in enumerate(ts):
        ctx.origin = ("af.r.trajectories", 0, i)
        a.process(t, state, ctx)
    (g,) = [o for o in a.tick(state, ctx) if isinstance(o, TrajectoryGroup)]
    assert g.refs and g.version_vector == {"solver": 5, "verifier": 7}
    # records without a vector (older ones) give a group without one
    (g,) = [o for o in run(a, [msgspec.structs.replace(t, version_vector={}) for t in ts])[0]
            if isinstance(o, TrajectoryGroup)]
    assert g.version_vector == {}


def test_an_assembler_checkpoint_from_before_agents_still_loads() -> None:
    a = Assembler(group_size=2)
    out, state = run(a, [msgspec.structs.replace(traj("a#0", 0, 1.0), group_size=2)])
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(state))
    for g in old["open"].values():
        del g["agent"], g["vector"]
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=AssemblerState)
    out, _ = run(a, [msgspec.structs.replace(traj("a#0", 1, 0.0), group_size=2)], restored)
    (g,) = [o for o in out if isinstance(o, TrajectoryGroup)]
    assert g.agent == "" and len(g.trajectories) == 2
