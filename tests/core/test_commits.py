"""The commit rule: per partition, only the contiguous prefix of finished offsets."""

from __future__ import annotations

from astraflow.core.commits import OffsetTracker

A, B = ("t", 0), ("t", 1)


def test_commits_only_the_contiguous_prefix() -> None:
    tr = OffsetTracker()
    ea = {o: tr.deliver(A, o) for o in (10, 11, 12)}
    eb = tr.deliver(B, 3)
    assert tr.committable() == {}
    assert tr.finish(A, 12, ea[12])  # out of order: 10 and 11 still running
    assert tr.committable() == {}
    assert tr.finish(A, 10, ea[10])
    assert tr.committable() == {A: 10}
    tr.committed({A: 10})
    assert tr.committable() == {}
    assert tr.finish(A, 11, ea[11])
    assert tr.finish(B, 3, eb)
    assert tr.committable() == {A: 12, B: 3}
    assert tr.committable([B]) == {B: 3}
    assert tr.inflight() == 0


def test_revoked_partitions_forget_their_work() -> None:
    tr = OffsetTracker()
    e1 = tr.deliver(A, 0)
    tr.deliver(A, 1)
    assert tr.revoke([A]) == [e1]
    assert not tr.finish(A, 0, e1)  # finished after the revoke: the new owner redoes it
    assert tr.committable() == {}
    e2 = tr.deliver(A, 0)  # assigned back later: a new epoch
    assert e2 != e1
    assert not tr.finish(A, 0, e1)
    assert tr.finish(A, 0, e2)
    assert tr.committable() == {A: 0}
