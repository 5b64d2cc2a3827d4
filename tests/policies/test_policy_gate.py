"""The staleness capacity gate, alone and in a chain with GRESO."""

from __future__ import annotations

import math
import random

import msgspec
import pytest
from policy_helpers import manifest, stats, task

from astraflow.core.records import GroupStats, Record, Task, decode
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
    gate = chain.policies[0]
    assert released(chain.run([task(f"t{i}") for i in range(6)])) == ["t0", "t1"]
    # t0's group was kept; t1's group was dropped (dynamic sampling): its slot comes back
    chain.side(stats("t0", "none", kept=True))
    chain.side(stats("t1", "easy", kept=False))
    assert released(chain.tick()) == ["t2"]  # in flight 0 + accepted 1 < 2
    chain.side(stats("t1", "easy", kept=False))  # a redelivered GroupStats counts once
    chain.side(stats("x9", "easy", kept=False))  # a group this gate did not release: ignored
    assert chain.tick() == []
    assert chain.counters()["gate.started"] == 2 == gate.capacity(chain.ctx)
    # t2 kept: it stays started; nothing is released past the bound
    chain.side(stats("t2", "none", kept=True))
    assert chain.tick() == []
    c = chain.counters()
    assert c["gate.started"] == 2 and c["gate.accepted"] == 2 and c["gate.dropped"] == 1


def test_the_gate_reads_no_groups_topic_and_ignores_acceptance_records() -> None:
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=1, max_staleness=0))])
    assert chain.wants() == {"stats"}
    assert released(chain.run([task("a"), task("b")])) == ["a"]
    chain.side(GroupRef(group_id="a#0"))  # the head of a group on groups.<primary>
    assert chain.tick() == [] and chain.counters()["gate.started"] == 1
    chain.side(stats("a", "none", kept=False))
    assert released(chain.tick()) == ["b"]


def test_stats_written_before_the_kept_field_count_as_kept() -> None:
    old = msgspec.msgpack.encode({"schema": "GroupStats", "v": 1, "task_id": "a",
                                  "group_id": "a#0", "policy": "default", "n": 2,
                                  "reward_mean": 1.0, "reward_std": 0.0,
                                  "zero_variance": "easy", "version": 0})
    st = decode(old, GroupStats)
    assert st.kept is True
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=1, max_staleness=0))])
    assert released(chain.run([task("a"), task("b")])) == ["a"]
    chain.side(st)
    assert chain.tick() == [] and chain.counters()["gate.accepted"] == 1


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
    # the written-off group's GroupStats comes after all, kept: it holds a slot again
    chain.side(stats("a", "none", kept=True))
    c = chain.counters()
    assert c["gate.late"] == 1 and c["gate.accepted"] == 1 and c["gate.started"] == 2
    chain.side(stats("a", "none", kept=True))  # redelivered: counted once
    assert chain.counters()["gate.accepted"] == 1


def test_a_task_greso_skips_after_the_gate_does_not_use_capacity() -> None:
    greso = Greso(p_easy=0.0, floor_easy=0.0)
    chain = Chain("pre_rollout", [("gate", Gate(batch_size=2, max_staleness=0)),
                                  ("greso", greso)])
    chain.states[1].streaks["skip-me"] = Streak(1, "easy")
    out = chain.run([task("skip-me"), task("a"), task("b"), task("c")])
    assert released(out) == ["a", "b"]
    assert chain.counters()["greso.skipped"] == 1 and chain.counters()["gate.started"] == 2


def interleave(seed: int, make_gate=Gate, steps: int = 400) -> None:
    """One random history of the loop around the gate, checking the staleness bound after
    every event.

    Released groups are decided by a simulated post-rollout stage (kept or dropped); each
    decision sends a GroupStats, and a kept one also the head of its group on
    ``groups.<primary>``; the simulated trainer publishes version v+1 once (v+1)·B groups
    were kept. These records reach the gate in any order, some twice (redelivery), mixed
    with new tasks and ticks. The work really started — released groups not dropped — and
    the gate's own count must both stay within (max_staleness + version + 1) × B, with the
    version the gate has seen.
    """
    rng = random.Random(seed)
    b, s = rng.randint(1, 4), rng.randint(0, 2)
    chain = Chain("pre_rollout", [("gate", make_gate(batch_size=b, max_staleness=s,
                                                     lost_after_s=math.inf))])
    gate, state = chain.policies[0], chain.states[0]
    pending: list[Record] = []  # side records on their way, delivered in any order
    running: list[str] = []  # released groups the post-rollout stage has not decided
    released_n = dropped_n = kept_n = tasks_n = version = 0

    def check(out: list[Record], event: str) -> None:
        nonlocal released_n
        for r in out:
            if isinstance(r, Task):
                running.append(r.resolved_group_id())
                released_n += 1
        cap = gate.capacity(chain.ctx)
        where = f"seed={seed} B={b} s={s} after {event}"
        assert gate.started(state) <= cap, f"gate counts {gate.started(state)} > {cap}; {where}"
        assert released_n - dropped_n <= cap, (
            f"started work {released_n - dropped_n} > capacity {cap}; {where}")

    for _ in range(steps):
        x = rng.random()
        if x < 0.25:
            check(chain.feed(task(f"t{tasks_n}")), "a task")
            tasks_n += 1
        elif x < 0.35:
            check(chain.tick(), "a tick")
        elif x < 0.6 and running:
            gid = running.pop(rng.randrange(len(running)))
            kept = rng.random() < 0.6
            pending.append(stats(gid.split("#")[0], "none", group=gid, kept=kept))
            if kept:
                kept_n += 1
                pending.append(GroupRef(group_id=gid))
                while kept_n >= (version + 1) * b and rng.random() < 0.7:
                    version += 1
                    pending.append(manifest(version))
            else:
                dropped_n += 1
        elif x < 0.65:  # stats of a group another run released
            pending.append(stats(f"x{rng.randrange(1000)}", "hard", kept=rng.random() < 0.5))
        elif pending:
            r = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.1:
                pending.append(r)  # at-least-once: it will come again
            chain.side(r)
            check(chain.tick(), f"a {type(r).__name__}")
    rng.shuffle(pending)
    for r in pending:
        chain.side(r)
        check(chain.tick(), f"draining a {type(r).__name__}")
    # once every record is in, the gate's count is exact: not merely safe
    assert gate.started(state) == released_n - dropped_n, f"seed={seed}"


@pytest.mark.parametrize("block", range(4))
def test_any_interleaving_of_stats_acceptances_and_versions_keeps_the_bound(block: int) -> None:
    for seed in range(block * 100, (block + 1) * 100):
        interleave(seed)
