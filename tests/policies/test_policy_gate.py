"""The staleness capacity gate, alone and in a chain with GRESO."""

from __future__ import annotations

from policy_helpers import stats, task

from astraflow.core.records import Task
from astraflow.policies.base import GroupRef
from astraflow.policies.chain import Chain
from astraflow.policies.gate import Gate
from astraflow.policies.greso import Greso, Streak


def released(out: list) -> list[str]:
    return [r.id for r in out if isinstance(r, Task)]


def test_gate_stops_at_the_bound_and_resumes_when_the_version_advances() -> None:
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=2, max_staleness=1))])
    out = chain.run([task(f"t{i}") for i in range(10)])
    assert released(out) == ["t0", "t1", "t2", "t3"]  # (1 + 0 + 1) * 2
    assert not chain.ready()
    assert chain.tick() == []  # nothing changed: still full
    chain.set_version("default", 1)
    assert released(chain.tick()) == ["t4", "t5"]  # (1 + 1 + 1) * 2 = 6
    chain.set_version("other", 5)  # another policy's version is not ours
    assert chain.tick() == []
    chain.set_version("default", 3)
    assert released(chain.tick()) == ["t6", "t7", "t8", "t9"]
    assert chain.ready()
    assert chain.counters()["gate.released"] == 10


def test_groups_dropped_after_rollout_give_their_capacity_back() -> None:
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=2, max_staleness=0))])
    assert released(chain.run([task(f"t{i}") for i in range(6)])) == ["t0", "t1"]
    # t0's group is accepted; t1's group was dropped (dynamic sampling): closed, not accepted
    chain.side(GroupRef(group_id="t0#0"))
    chain.side(stats("t0", "none"))
    chain.side(stats("t1", "easy"))
    assert released(chain.tick()) == ["t2"]  # in flight 0 + accepted 1 < 2
    chain.side(stats("t1", "easy"))  # a redelivered GroupStats does not count twice
    chain.side(stats("x9", "easy"))  # nor does a group this gate did not release
    chain.side(GroupRef(group_id="x8#0"))
    assert chain.tick() == []
    assert chain.counters()["gate.started"] == 2
    # the accepted group seen after its GroupStats still counts
    chain.side(stats("t2", "none"))
    assert released(chain.tick()) == ["t3"]
    chain.side(GroupRef(group_id="t2#0"))
    assert chain.tick() == [] and chain.counters()["gate.started"] == 3  # t3 + 2 accepted


def test_a_group_that_never_comes_back_is_written_off() -> None:
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=1, max_staleness=0,
                                                lost_after_s=60))])
    chain.ctx.now = 1000.0
    assert released(chain.run([task("a"), task("b")])) == ["a"]
    chain.ctx.now = 1059.0
    assert chain.tick() == []
    chain.ctx.now = 1060.0
    assert released(chain.tick()) == ["b"]
    assert chain.counters()["gate.lost"] == 1


def test_a_task_greso_skips_after_the_gate_does_not_use_capacity() -> None:
    greso = Greso(p_easy=0.0, floor_easy=0.0)
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=2, max_staleness=0)),
                                  ("greso", greso)])
    chain.states[1].streaks["skip-me"] = Streak(1, "easy")
    out = chain.run([task("skip-me"), task("a"), task("b"), task("c")])
    assert released(out) == ["a", "b"]
    assert chain.counters()["greso.skipped"] == 1 and chain.counters()["gate.started"] == 2
