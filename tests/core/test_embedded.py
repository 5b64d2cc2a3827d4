"""Checks specific to the embedded (SQLite) bus; the shared semantics are in the conformance
suite. Several tests use real OS processes, because sharing one file between processes is
the point of this backend."""

from __future__ import annotations

import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from waiting import wait_for

from astraflow.core.bus import connect
from astraflow.core.bus.embedded_group import assign
from astraflow.core.errors import BusError, CommitError, RecordTooLargeError, TopicError


def _url(tmp_path: Path) -> str:
    return f"embedded://{tmp_path}/run/bus.db"


def _spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                            stdout=subprocess.PIPE, text=True)


def _wait_line(proc: subprocess.Popen[str], expected: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if ready:
            line = proc.stdout.readline()
            assert line, f"child exited (rc={proc.poll()}) before printing {expected!r}"
            if line.strip() == expected:
                return
    raise AssertionError(f"child did not print {expected!r} within {timeout}s")


def _poll_until(consumers, done, timeout: float = 10.0) -> list:
    """Poll every consumer until ``done()``; return the records delivered meanwhile."""
    records = []

    def consume() -> None:
        for c in consumers:
            records.extend(c.consume(100, timeout=0.02))

    wait_for(done, timeout, "the condition", tick=consume)
    return records


def test_wal_mode_and_schema_reopen_is_idempotent(tmp_path):
    bus = connect(_url(tmp_path))
    bus.create_topics({"t": 2})
    producer = bus.producer()
    producer.produce("t", b"v", partition=1)
    producer.close()
    bus.close()
    assert bus.url == f"embedded://{tmp_path}/run/bus.db"

    with sqlite3.connect(tmp_path / "run" / "bus.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for _ in range(2):  # re-opening neither fails nor loses anything
        again = connect(_url(tmp_path), config={"synchronous": "full"})
        assert again.list_topics() == {"t": 2}
        assert again.describe_topic("t").end_offsets == {0: 0, 1: 1}
        again.close()


def test_bad_options_are_refused_with_the_valid_values(tmp_path):
    with pytest.raises(BusError, match="synchronous='off'.*normal, full"):
        connect(_url(tmp_path), config={"synchronous": "off"})
    with pytest.raises(BusError, match="unknown embedded bus option.*bogus"):
        connect(_url(tmp_path) + "?bogus=1")


def test_create_topics_validation(tmp_path):
    bus = connect(_url(tmp_path))
    with pytest.raises(TopicError, match="invalid topic name 'a b'"):
        bus.create_topics({"a b": 1})
    with pytest.raises(TopicError, match="250 characters long; the limit is 249"):
        bus.create_topics({"x" * 250: 1})
    with pytest.raises(TopicError, match="partitions must be an integer >= 1, got 0"):
        bus.create_topics({"ok": 0})
    assert bus.list_topics() == {}  # nothing is created when anything is invalid

    bus.create_topics({"af.run_1.tasks-x": 3})
    bus.create_topics({"af.run_1.tasks-x": 3})  # exist_ok by default
    with pytest.raises(TopicError, match="exists with 3 partitions, asked for 4"):
        bus.create_topics({"af.run_1.tasks-x": 4})
    with pytest.raises(TopicError, match="already exists"):
        bus.create_topics({"af.run_1.tasks-x": 3}, exist_ok=False)
    with pytest.raises(TopicError, match="unknown topic 'missing'.*astraflow topics create"):
        bus.describe_topic("missing")
    bus.close()


def test_produce_errors_are_raised_at_once(tmp_path):
    bus = connect(_url(tmp_path), max_message_bytes=1000)
    bus.create_topics({"t": 2})
    producer = bus.producer()
    with pytest.raises(RecordTooLargeError) as err:
        producer.produce("t", b"x" * 990, key=b"k" * 20)
    text = str(err.value)
    assert "1010 bytes" in text and "max_message_bytes=1000" in text
    assert "weight store" in text and "message.max.bytes" in text
    with pytest.raises(TopicError, match="unknown topic 'nope'.*create_topics"):
        producer.produce("nope", b"v")
    with pytest.raises(TopicError, match="partition 2 out of range.*0..1"):
        producer.produce("t", b"v", partition=2)
    producer.close()
    bus.close()


def test_two_processes_produce_dense_unique_offsets(tmp_path):
    # Both processes also race to create the schema and the topic on a fresh file.
    per_process = 1500
    code = f"""
        import sys, time
        from pathlib import Path
        from astraflow.core.bus import connect
        name, tmp = sys.argv[1], Path({str(tmp_path)!r})
        (tmp / f"ready-{{name}}").touch()
        deadline = time.monotonic() + 30
        while len(list(tmp.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # start together, so that the writers really interleave
        bus = connect({_url(tmp_path)!r})
        bus.create_topics({{"t": 2}})
        p = bus.producer()
        for i in range({per_process}):
            p.produce("t", f"{{name}}:{{i}}".encode(), partition=0)
            if i % 3 == 2:
                p.flush()
        p.close()
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), name])
             for name in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]

    bus = connect(_url(tmp_path))
    consumer = bus.consumer("check", ["t"])
    records = []
    while len(records) < 2 * per_process:
        batch = consumer.consume(500, timeout=5.0)
        assert batch, f"only {len(records)} records"
        records.extend(batch)
    assert [m.offset for m in records] == list(range(2 * per_process))
    for name in ("a", "b"):  # nothing lost, and each writer's order kept
        seq = [int(m.value.split(b":")[1]) for m in records if m.value.startswith(name.encode())]
        assert seq == list(range(per_process))
    assert bus.describe_topic("t").end_offsets == {0: 2 * per_process, 1: 0}
    bus.close()


def test_flushed_records_survive_sigkill(tmp_path):
    connect(_url(tmp_path)).create_topics({"t": 1})
    proc = _spawn(f"""
        import os, signal
        from astraflow.core.bus import connect
        p = connect({_url(tmp_path)!r}).producer()
        for i in range(300):
            p.produce("t", str(i).encode())
        p.flush()
        p.produce("t", b"never flushed")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    bus = connect(_url(tmp_path))
    assert bus.describe_topic("t").end_offsets == {0: 300}
    consumer = bus.consumer("g", ["t"])
    values = [m.value for m in consumer.consume(500, timeout=2.0)]
    assert values == [str(i).encode() for i in range(300)]
    bus.close()


def test_killed_member_is_expired_and_its_partitions_redelivered(tmp_path):
    bus = connect(_url(tmp_path))
    bus.create_topics({"t": 4})
    producer = bus.producer()
    for p in range(4):
        for i in range(5):
            producer.produce("t", f"{p}:{i}".encode(), partition=p)
    producer.flush()
    child = _spawn(f"""
        from astraflow.core.bus import connect
        c = connect({_url(tmp_path)!r}).consumer("g", ["t"], session_timeout=1.5)
        while len(c.assignment()) < 4:
            c.poll(0.05)
        print("READY", flush=True)
        while True:  # consumes, never commits; releases what a newcomer should own
            c.poll(0.05)
    """)
    try:
        _wait_line(child, "READY", timeout=20)
        live = bus.consumer("g", ["t"], session_timeout=1.5)
        records = _poll_until([live], lambda: len(live.assignment()) == 2)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # Expiry takes session_timeout plus a heartbeat interval; _poll_until has a deadline.
        records += _poll_until([live], lambda: len(live.assignment()) == 4)
        records += _poll_until([live], lambda: len({(m.partition, m.offset)
                                                    for m in records}) == 20)
        assert {m.value for m in records} == {f"{p}:{i}".encode()
                                              for p in range(4) for i in range(5)}
    finally:
        if child.poll() is None:
            child.kill()
    bus.close()


def test_members_split_partitions_and_take_over_on_close(tmp_path):
    bus = connect(_url(tmp_path))
    bus.create_topics({"t": 4})
    revoked: list = []
    a = bus.consumer("g", ["t"], on_revoke=revoked.extend)
    b = bus.consumer("g", ["t"])
    other = bus.consumer("other-group", ["t"])  # groups are independent
    _poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
    assert not set(a.assignment()) & set(b.assignment())
    assert sorted(revoked) == b.assignment()  # a gave them up before b owned them
    assert len(other.assignment()) == 4
    a.close()
    a.close()  # idempotent
    _poll_until([b], lambda: len(b.assignment()) == 4, timeout=5.0)  # < the 10 s session
    bus.close()


def test_commit_refused_after_reassignment_and_never_backwards(tmp_path):
    bus = connect(_url(tmp_path))
    bus.create_topics({"t": 4})
    producer = bus.producer()
    for p in range(4):
        for _ in range(3):
            producer.produce("t", b"v", partition=p)
    producer.flush()
    a = bus.consumer("g", ["t"])
    records = []
    while len(records) < 12:
        records += a.consume(100, timeout=1.0)
    b = bus.consumer("g", ["t"])
    a.consume(timeout=0)  # a notices b and releases half
    assert len(a.assignment()) == 2
    with pytest.raises(CommitError, match=r"t\[\d\].*reassigned to another member"):
        a.commit(records)
    kept = {p for _, p in a.assignment()}
    assert bus.committed("g", "t") == dict.fromkeys(kept, 3)  # owned ones were committed
    a.commit([m for m in records if m.partition in kept and m.offset == 0])
    assert bus.committed("g", "t") == dict.fromkeys(kept, 3)  # never backwards
    assert bus.lag("g", "t") == {p: 0 if p in kept else 3 for p in range(4)}
    b.close()
    a.close()
    bus.close()


def test_assign_is_deterministic_balanced_and_sticky():
    members = [f"m{i}" for i in range(5)]
    plan = assign(members, "t", 32)
    assert plan == assign(list(reversed(members)), "t", 32)
    assert sorted(p for ps in plan.values() for p in ps) == list(range(32))
    assert {len(ps) for ps in plan.values()} == {6, 7}
    grown = assign([*members, "m5"], "t", 32)
    moved = sum(p not in grown[m] for m in members for p in plan[m])
    assert moved <= 10  # a round-robin reshuffle would move most of the 32


def test_seek_unassigned_and_closed_consumer_raise(tmp_path):
    bus = connect(_url(tmp_path))
    bus.create_topics({"t": 1})
    consumer = bus.consumer("g", ["t"])
    with pytest.raises(BusError, match="not assigned"):
        consumer.seek("t", 5, 0)
    consumer.close()
    with pytest.raises(BusError, match="closed"):
        consumer.poll(0)
    bus.close()
