"""Replay and the batcher on crafted group streams."""

from __future__ import annotations

import pytest
from policy_helpers import tgroup

from astraflow.core.records import Batch
from astraflow.policies.base import Context, PolicyError
from astraflow.policies.batcher import Batcher
from astraflow.policies.chain import Chain
from astraflow.policies.replay import Replay


def batches(out: list) -> list[Batch]:
    return [b for b in out if isinstance(b, Batch)]


def test_batcher_makes_batches_of_b_whole_groups_with_sequential_ids() -> None:
    b = Batcher(policy="default", batch_size=3)
    state = b.init_state()
    groups = [tgroup(f"g{i}", [1, 0]) for i in range(7)]
    out = [o for g in groups + [groups[0]] for o in b.process(g, state, Context())]
    assert [x.id for x in out] == ["default-0", "default-1"]
    assert [[g.group_id for g in x.groups] for x in out] == [["g0", "g1", "g2"],
                                                            ["g3", "g4", "g5"]]
    assert out[0].seq == 0 and len(out[0].groups[0].trajectories) == 2
    assert state.counts["duplicate"] == 1 and len(state.pending) == 1
    with pytest.raises(PolicyError):
        b.process(tgroup("x", [1, 0], policy="other"), state, Context())


def run_replay(ratio: float, batch_size: int, n_fresh: int, **kw) -> list[Batch]:
    chain = Chain("batch", [("replay", Replay(batch_size=batch_size, ratio=ratio, **kw)),
                            ("batcher", Batcher(policy="default", batch_size=batch_size))])
    return batches(chain.run(tgroup(f"g{i}", [1, 0, i % 3]) for i in range(n_fresh)))


@pytest.mark.parametrize(("ratio", "batch_size"), [(0.25, 8), (0.3, 4), (0.5, 2)])
def test_replay_ratio_holds_over_many_batches(ratio: float, batch_size: int) -> None:
    out = run_replay(ratio, batch_size, 2000, capacity=64, max_staleness=100)
    replayed = sum(g.replayed for b in out for g in b.groups)
    total = sum(len(b.groups) for b in out)
    assert all(len(b.groups) == batch_size for b in out)
    # the first batch has nothing to replay yet; after it the ratio is exact
    assert replayed / total == pytest.approx(ratio, abs=1.5 * batch_size / total)
    steady = out[1:]
    assert sum(g.replayed for b in steady for g in b.groups) == pytest.approx(
        ratio * batch_size * len(steady), abs=1)
    for b in out:  # never the same group twice in a batch; replays are flagged
        ids = [g.group_id for g in b.groups]
        assert len(ids) == len(set(ids))
    fresh = [g.group_id for b in out for g in b.groups if not g.replayed]
    assert len(fresh) == len(set(fresh))


def test_replayed_groups_obey_their_own_staleness_bound() -> None:
    replay = Replay(batch_size=2, ratio=0.5, max_staleness=1, capacity=100)
    chain = Chain("batch", [("replay", replay), ("batcher", Batcher(policy="default",
                                                                    batch_size=2))])
    chain.run([tgroup("old0", [1, 0], version=0), tgroup("old1", [1, 0], version=0)])
    chain.set_version("default", 5)
    out = batches(chain.run([tgroup("new0", [1, 0], version=5),
                             tgroup("new1", [1, 0], version=5)]))
    assert [[(g.group_id, g.replayed) for g in b.groups] for b in out] == [
        [("new0", False), ("new1", False)]]  # no candidate: filled with fresh
    assert chain.counters()["replay.evicted_stale"] == 2


def test_advantage_selection_prefers_high_advantage_groups() -> None:
    replay = Replay(batch_size=2, ratio=0.5, selection="advantage", capacity=1000,
                    max_uses=1000, seed=7)
    state = replay.init_state()
    ctx = Context()
    for i in range(20):  # ten flat (|adv| ~ 0) and ten spread (|adv| = 0.5) groups
        replay.process(tgroup(f"flat{i}", [0.5, 0.5]), state, ctx)
        replay.process(tgroup(f"wide{i}", [0.0, 1.0]), state, ctx)
    picks = [g.group_id for i in range(300)
             for g in replay.process(tgroup(f"n{i}", [0, 1]), state, ctx) if g.replayed]
    assert sum(p.startswith("wide") or p.startswith("n") for p in picks) / len(picks) > 0.99


def test_recent_selection_takes_the_newest_and_max_uses_evicts() -> None:
    replay = Replay(batch_size=2, ratio=0.5, capacity=10, max_uses=1)
    chain = Chain("batch", [("replay", replay), ("batcher", Batcher(policy="default",
                                                                    batch_size=2))])
    out = batches(chain.run([tgroup(f"g{i}", [1, 0]) for i in range(4)]))
    assert [[(g.group_id, g.replayed) for g in b.groups] for b in out] == [
        [("g0", False), ("g1", False)], [("g2", False), ("g1", True)],
        [("g3", False), ("g2", True)]]


def test_batch_ahead_holds_batches_until_the_trainer_catches_up() -> None:
    # a trainer that is dead or slow: with batch_ahead 2 the stage lets out batches 0 and 1
    # only; the rest wait (and the stage stops reading) until weights.<p> moves on
    from astraflow.policies.filters import Staleness

    chain = Chain("batch", [("staleness", Staleness(max_staleness=1)),
                            ("batcher", Batcher(policy="default", batch_size=2, ahead=2))])
    out = batches(chain.run(tgroup(f"g{i}", [1, 0], version=0) for i in range(6)))
    assert [b.seq for b in out] == [0, 1]
    assert chain.ready() is False  # a whole batch is held: read no more
    assert chain.tick() == []  # still held
    chain.set_version("default", 1)
    assert [b.seq for b in batches(chain.tick())] == [2]
    assert chain.ready() is True
    # groups read once the trainer is far ahead are judged against its version: stale ones
    # never reach a batch
    chain.set_version("default", 5)
    late = batches(chain.run([tgroup("old", [1, 0], version=1), tgroup("new1", [1, 0], version=4),
                              tgroup("new2", [0, 1], version=5)]))
    assert [[g.group_id for g in b.groups] for b in late] == [["new1", "new2"]]
    counts = chain.counters()
    assert counts["staleness.dropped_stale"] == 1 and counts["batcher.ahead"] == -1
    with pytest.raises(PolicyError, match="batch_ahead"):
        Batcher(policy="default", batch_size=2, ahead=0)


def test_without_batch_ahead_batches_leave_whatever_the_trainer_does() -> None:
    b = Batcher(policy="default", batch_size=2)
    state = b.init_state()
    out = [o for i in range(10) for o in b.process(tgroup(f"g{i}", [1, 0]), state, Context())]
    assert len(out) == 5 and b.ready(state)
