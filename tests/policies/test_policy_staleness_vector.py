"""The staleness filter respects the version vector: a group is as stale as the oldest version
of any policy its episodes were produced under, each policy judged by its own bound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
from policy_helpers import manifest, produce, read_all, tgroup, trained_to, traj

from astraflow.config import ExperimentConfig
from astraflow.core.records import GroupStats, TrajectoryGroup
from astraflow.core.topics import topic_name
from astraflow.policies.assembler import Assembler
from astraflow.policies.base import Context
from astraflow.policies.chain import Chain
from astraflow.policies.config import DataConfig
from astraflow.policies.env import BuildEnv
from astraflow.policies.filters import Staleness, build_staleness
from astraflow.run.resources import open_bus
from astraflow.run.roles import run_configured_stage


def solver_group(name: str, vector: dict[str, int], *, version: int = 10) -> TrajectoryGroup:
    return msgspec.structs.replace(tgroup(name, [1, 0], version=version, policy="solver"),
                                   version_vector=vector)


def test_a_solver_group_judged_by_an_old_verifier_is_dropped_and_the_reason_named() -> None:
    f = Staleness(max_staleness=2, per_policy={"verifier": 3})
    state = f.init_state()
    ctx = Context(versions={"solver": 10, "verifier": 20})
    groups = [solver_group("v17", {"solver": 10, "verifier": 17}),  # 3 behind: kept
              solver_group("v16", {"solver": 10, "verifier": 16}),  # 4 > 3: dropped
              solver_group("own", {"solver": 7, "verifier": 20}, version=7),  # own rule
              # the own policy's vector entry is not judged: its tokens are
              solver_group("tokens", {"solver": 1, "verifier": 20}, version=9),
              # a policy no trainer publishes (version 0 here) never ages a group
              solver_group("frozen", {"solver": 10, "verifier": 20, "ref": 5})]
    kept = [o.group_id for g in groups for o in f.process(g, state, ctx)]
    assert kept == ["v17", "tokens", "frozen"]
    assert state.counts == {"kept": 3, "dropped_stale": 2, "dropped_stale.solver": 2,
                            "stale:verifier": 1}


def test_groups_without_a_vector_are_judged_as_before() -> None:
    f = Staleness(max_staleness=2)
    state = f.init_state()
    ctx = Context(versions={"solver": 10, "verifier": 99})
    groups = [tgroup("v8", [1, 0], version=8, policy="solver"),
              tgroup("v7", [1, 0], version=7, policy="solver"),
              tgroup("none", [1, 0], version=-1, policy="solver")]
    assert [o.group_id for g in groups for o in f.process(g, state, ctx)] == ["v8", "none"]
    assert state.counts == {"kept": 2, "dropped_stale": 1}


def test_a_group_without_own_tokens_is_still_aged_by_the_other_policies() -> None:
    f = build_staleness(BuildEnv(data=DataConfig(max_staleness=1), stage="post_rollout",
                                 policies=("solver", "verifier"), primary="solver"))
    state = f.init_state()
    ctx = Context(versions={"verifier": 5})
    g = solver_group("empty", {"verifier": 3}, version=-1)
    assert f.process(g, state, ctx) == []
    assert state.counts["stale:verifier"] == 1


def test_in_the_post_rollout_chain_the_dropped_groups_stats_say_not_kept() -> None:
    chain = Chain("post_rollout", [("assembler", Assembler(group_size=2)),
                                   ("staleness", Staleness(max_staleness=2))])
    chain.set_version("verifier", 9)
    old = [msgspec.structs.replace(traj("old#0", i, float(i), policy="solver"), group_size=2,
                                   version_vector={"solver": 0, "verifier": 6}) for i in (0, 1)]
    new = [msgspec.structs.replace(traj("new#0", i, float(i), policy="solver"), group_size=2,
                                   version_vector={"solver": 0, "verifier": 7}) for i in (0, 1)]
    out = chain.run(old + new)
    assert [g.group_id for g in out if isinstance(g, TrajectoryGroup)] == ["new#0"]
    assert {s.group_id: s.kept for s in out if isinstance(s, GroupStats)} == {
        "old#0": False, "new#0": True}
    assert chain.counters()["staleness.stale:verifier"] == 1


def test_the_post_rollout_stage_learns_every_policys_version_from_its_weights(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    """On the embedded bus: the stage reads weights.<q> for every policy q and drops the solver
    groups whose verifier is more than the verifier's bound behind the verifier's trainer."""
    cfg = make_config({"post_rollout": ["assembler", "staleness"],
                       "assembler": {"group_size": 2}, "commit_interval_s": 0.001,
                       "max_staleness_per_policy": {"verifier": 2}},
                      policies=["solver", "verifier"])
    bus = open_bus(cfg, tmp_path)
    try:
        trained_to(bus, cfg.run, 10, "verifier")
        trained_to(bus, cfg.run, 1, "solver")
        produce(bus, cfg.run, "weights", [manifest(10, "verifier")], policy="verifier")
        produce(bus, cfg.run, "weights", [manifest(1, "solver")], policy="solver")
        records = [msgspec.structs.replace(traj(f"t{k}#0", i, float(i), policy="solver"),
                                           group_size=2,
                                           version_vector={"solver": 0, "verifier": v})
                   for k, v in enumerate([7, 8, 10]) for i in (0, 1)]
        produce(bus, cfg.run, "trajectories", records)
        counters = run_configured_stage(cfg, "post_rollout", bus=bus, max_records=len(records),
                             timeout=30)
        groups = read_all(bus, topic_name(cfg.run, "groups", "solver"))
        stats = read_all(bus, topic_name(cfg.run, "stats"))
    finally:
        bus.close()
    assert sorted(g.group_id for g in groups) == ["t1#0", "t2#0"]
    assert {s.group_id: s.kept for s in stats} == {"t0#0": False, "t1#0": True, "t2#0": True}
    assert counters["staleness.stale:verifier"] == 1
    assert counters["staleness.dropped_stale"] == 1
