"""One conformance suite, run against both bus backends (embedded and real Kafka).

The same assertions must hold for both: this is what lets a component move from a laptop to
a cluster by changing one URL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from waiting import wait_for as wait_until

from astraflow.core.bus import Bus, Consumer, Message
from astraflow.core.bus.partitioner import partition_for
from astraflow.core.bus.reader import read_all
from astraflow.core.errors import BusError, CommitError, RecordTooLargeError, TopicError
from astraflow.core.records import ChatMessage, DeadLetter, Task, decode, encode
from astraflow.core.stream import Output, run_processor

WORKER = Path(__file__).with_name("_bus_worker.py")


def task(i: int) -> Task:
    return Task(id=f"task-{i}", dataset="conformance",
                prompt=[ChatMessage(role="user", content=f"{i}+{i}=")], reference={"answer": 2 * i})


def produce_tasks(bus: Bus, topic: str, ids: range) -> None:
    p = bus.producer()
    for i in ids:
        p.produce(topic, encode(task(i)), key=f"task-{i}".encode())
    p.flush()
    p.close()


def drain(consumer: Consumer, n: int, timeout: float = 60.0) -> list[Message]:
    """Consume until ``n`` records arrived or ``timeout`` passed."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out.extend(consumer.consume(n - len(out), 0.5))
    return out


def test_per_partition_order_and_key_routing(bus: Bus, new_topic, new_group) -> None:
    topic = new_topic(partitions=4)
    keys = [f"k{j}".encode() for j in range(10)]
    p = bus.producer()
    for seq in range(30):
        for k in keys:
            p.produce(topic, f"{k.decode()}:{seq}".encode(), key=k)
    p.flush()
    c = bus.consumer(new_group(), [topic])
    msgs = drain(c, 300)
    c.close()
    assert len(msgs) == 300
    last_offset: dict[int, int] = {}
    last_seq: dict[bytes, int] = {}
    partition_of: dict[bytes, int] = {}
    for m in msgs:
        assert m.offset > last_offset.get(m.partition, -1), "offsets must rise within a partition"
        last_offset[m.partition] = m.offset
        seq = int(m.value.split(b":")[1])
        assert m.key is not None
        assert seq == last_seq.get(m.key, -1) + 1, "a key's records must arrive in order"
        last_seq[m.key] = seq
        assert partition_of.setdefault(m.key, m.partition) == m.partition
        # Same routing on both backends: Kafka's murmur2.
        assert m.partition == partition_for(m.key, 4)
    assert len(set(partition_of.values())) > 1


def test_keys_headers_and_timestamps_round_trip(bus: Bus, new_topic, new_group) -> None:
    topic = new_topic()
    p = bus.producer()
    before = time.time()
    p.produce(topic, b"v1", key=b"k1", headers=[("af-schema", b"Task/1"), ("x", b"\x00\xff")])
    p.produce(topic, b"v2")
    p.flush()
    c = bus.consumer(new_group(), [topic])
    a, b = drain(c, 2)
    c.close()
    assert (a.key, a.value, a.header("af-schema"), a.header("x")) == (
        b"k1", b"v1", b"Task/1", b"\x00\xff")
    assert (b.key, b.value, b.headers) == (None, b"v2", [])
    assert before - 5 <= a.timestamp <= time.time() + 5
    assert a.origin == f"{topic}[0]@0"


def test_commit_and_resume_from_committed_offset(bus: Bus, new_topic, new_group) -> None:
    topic, group = new_topic(), new_group()
    produce_tasks(bus, topic, range(100))
    c = bus.consumer(group, [topic])
    first = drain(c, 40)
    assert [m.offset for m in first] == list(range(40))
    c.commit(first[:25])  # processed 25 of the 40 delivered
    c.close()
    assert bus.committed(group, topic) == {0: 25}
    assert bus.lag(group, topic) == {0: 75}
    c = bus.consumer(group, [topic])
    rest = drain(c, 75)
    assert [m.offset for m in rest] == list(range(25, 100)), "resume exactly after the commit"
    c.commit()
    c.close()
    assert bus.lag(group, topic) == {0: 0}
    assert bus.describe_topic(topic).end_offsets == {0: 100}


def test_uncommitted_records_are_redelivered_after_crash(bus: Bus, new_topic, new_group) -> None:
    topic, group = new_topic(partitions=3), new_group()
    produce_tasks(bus, topic, range(90))
    c = bus.consumer(group, [topic])
    got = drain(c, 90)
    assert len(got) == 90
    by_part: dict[int, list[Message]] = defaultdict(list)
    for m in got:
        by_part[m.partition].append(m)
    # Commit only the first half of each partition, then "crash" (leave without committing).
    c.commit([ms[len(ms) // 2 - 1] for ms in by_part.values() if len(ms) >= 2])
    c.close()
    expected = {(p, m.offset) for p, ms in by_part.items() for m in ms[len(ms) // 2:]
                if len(ms) >= 2}
    c = bus.consumer(group, [topic])
    again = drain(c, len(expected), timeout=30)
    again += c.consume(100, 1.0)  # nothing beyond the uncommitted records comes back
    c.close()
    assert sorted((m.partition, m.offset) for m in again) == sorted(expected)


def test_start_latest_skips_existing_records(bus: Bus, new_topic, new_group) -> None:
    topic = new_topic()
    produce_tasks(bus, topic, range(5))
    c = bus.consumer(new_group(), [topic], start="latest")
    wait_until(lambda: bool(c.assignment()), 30, "assignment", tick=lambda: c.poll(0.1))
    produce_tasks(bus, topic, range(5, 8))
    got = drain(c, 3, timeout=30)
    c.close()
    assert [decode(m.value, Task).id for m in got] == ["task-5", "task-6", "task-7"]


def test_rebalance_when_members_join_and_leave(bus: Bus, new_topic, new_group) -> None:
    topic, group = new_topic(partitions=6), new_group()
    everything = {(topic, p) for p in range(6)}
    a = bus.consumer(group, [topic], client_id="a", session_timeout=6)
    wait_until(lambda: set(a.assignment()) == everything, 30, "a to own all partitions",
               tick=lambda: a.poll(0.1))
    b = bus.consumer(group, [topic], client_id="b", session_timeout=6)

    def balanced() -> bool:
        sa, sb = set(a.assignment()), set(b.assignment())
        return bool(sa) and bool(sb) and not (sa & sb) and (sa | sb) == everything

    wait_until(balanced, 45, "the partitions to be shared by a and b",
               tick=lambda: (a.poll(0.05), b.poll(0.05)))
    a.close()
    wait_until(lambda: set(b.assignment()) == everything, 45, "b to take over a's partitions",
               tick=lambda: b.poll(0.1))
    b.close()


def test_members_share_the_work_without_loss(bus: Bus, new_topic, new_group) -> None:
    topic, group = new_topic(partitions=4), new_group()
    produce_tasks(bus, topic, range(200))
    a = bus.consumer(group, [topic], client_id="a")
    b = bus.consumer(group, [topic], client_id="b")
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while sum(seen.values()) < 200 and time.monotonic() < deadline:
        for c in (a, b):
            batch = c.consume(20, 0.1)
            seen.update(decode(m.value, Task).id for m in batch)
            if batch:
                # A rebalance may have moved the partition: it is redelivered elsewhere.
                with contextlib.suppress(CommitError):
                    c.commit(batch)
    a.close()
    b.close()
    assert set(seen) == {f"task-{i}" for i in range(200)}


def _spawn_worker(url: str, group: str, src: str, dst: str, dlq: str, delay: float,
                  session: float) -> subprocess.Popen[str]:
    """A worker process; its stderr in a temporary file (a pipe nobody reads while it runs
    would stop a chatty worker once full), read back with :func:`_stderr`."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, group, src, dst, dlq, str(delay), str(session)],
        stdout=subprocess.DEVNULL, stderr=tempfile.TemporaryFile("w+"), text=True)


def _stderr(proc: subprocess.Popen[str]) -> str:
    file = proc.stderr
    if file is None:
        return ""
    file.seek(0)
    return file.read()


@pytest.mark.slow
def test_process_killed_with_sigkill_loses_nothing(bus: Bus, bus_url: str, new_topic,
                                                   new_group) -> None:
    src, dst, dlq = new_topic(partitions=4), new_topic(partitions=1), new_topic()
    group = new_group()
    n = 240
    produce_tasks(bus, src, range(n))
    session = 3.0
    victim = _spawn_worker(bus_url, group, src, dst, dlq, 0.01, session)
    survivor = _spawn_worker(bus_url, group, src, dst, dlq, 0.01, session)
    reader = bus.consumer(new_group(), [dst])
    outputs: Counter[str] = Counter()
    try:
        # Kill one worker mid-stream, once some output exists but much work remains.
        wait_until(lambda: sum(outputs.values()) >= 40, 60, "the workers to make progress",
                   tick=lambda: outputs.update(
                       decode(m.value, Task).id for m in reader.consume(100, 0.1)))
        assert victim.poll() is None and survivor.poll() is None, "workers died early"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        wait_until(lambda: set(outputs) >= {f"task-{i}" for i in range(n)}, 120,
                   "every input to be processed after the kill",
                   tick=lambda: outputs.update(
                       decode(m.value, Task).id for m in reader.consume(200, 0.2)))
        wait_until(lambda: sum(bus.lag(group, src).values()) == 0, 60,
                   "the survivor to commit everything")
    finally:
        reader.close()
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (survivor, victim):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert victim.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, _stderr(survivor)
    assert set(outputs) == {f"task-{i}" for i in range(n)}, "no record lost"
    assert sum(bus.describe_topic(dlq).end_offsets.values()) == 0


def test_restarted_consumer_side_loses_nothing_committed(bus: Bus, new_topic,
                                                         new_group) -> None:
    src, dst, dlq = new_topic(partitions=2), new_topic(), new_topic()
    group = new_group()
    produce_tasks(bus, src, range(60))

    def copy(t: Task, _m: Message) -> list[Output]:
        return [Output(dst, t, t.id.encode())]

    s1 = run_processor(bus, group=group, inputs=[src], kind=Task, handle=copy, dlq=dlq,
                       max_records=25, timeout=60, batch_size=5)
    assert s1.consumed == 25
    produce_tasks(bus, src, range(60, 80))
    s2 = run_processor(bus, group=group, inputs=[src], kind=Task, handle=copy, dlq=dlq,
                       max_records=55, timeout=60, batch_size=5)
    assert s2.consumed == 55, "the restart resumes after the committed records only"
    assert sum(bus.lag(group, src).values()) == 0
    reader = bus.consumer(new_group(), [dst])
    ids = Counter(decode(m.value, Task).id for m in drain(reader, 80, timeout=30))
    reader.close()
    assert ids == Counter({f"task-{i}": 1 for i in range(80)})


def test_malformed_records_go_to_the_dead_letter_topic(bus: Bus, new_topic, new_group) -> None:
    src, dst, dlq = new_topic(), new_topic(), new_topic()
    p = bus.producer()
    p.produce(src, encode(task(0)), key=b"task-0")
    p.produce(src, b"\xc1 not msgpack", key=b"bad-bytes")
    p.produce(src, encode(task(1))[:-3], key=b"truncated")
    p.produce(src, encode(DeadLetter(origin="x[0]@0", topic="x", partition=0, offset=0,
                                     value=b"", error="e", error_type="E")), key=b"wrong-type")
    p.produce(src, encode(task(2)), key=b"task-2")
    p.produce(src, encode(task(3)), key=b"task-3")
    p.flush()

    def copy(t: Task, _m: Message) -> list[Output]:
        if t.id == "task-3":
            raise RuntimeError("handler failed on task-3")
        return [Output(dst, t)]

    group = new_group()
    stats = run_processor(bus, group=group, inputs=[src], kind=Task, handle=copy, dlq=dlq,
                          max_records=6, timeout=60)
    assert (stats.consumed, stats.produced, stats.dead_lettered) == (6, 2, 4)
    assert bus.lag(group, src) == {0: 0}, "the consumer went on past the bad records"
    c = bus.consumer(new_group(), [dlq, dst])
    got = drain(c, 6, timeout=30)
    c.close()
    letters = [decode(m.value, DeadLetter) for m in got if m.topic == dlq]
    assert sorted(d.key for d in letters) == [b"bad-bytes", b"task-3", b"truncated", b"wrong-type"]
    by_key = {d.key: d for d in letters}
    assert by_key[b"bad-bytes"].origin == f"{src}[0]@1"
    assert by_key[b"bad-bytes"].value == b"\xc1 not msgpack"
    assert by_key[b"bad-bytes"].error_type == "SchemaError"
    assert "schema" in by_key[b"wrong-type"].error
    assert by_key[b"task-3"].error == "handler failed on task-3"
    assert by_key[b"task-3"].group == group
    assert sorted(decode(m.value, Task).id for m in got if m.topic == dst) == ["task-0", "task-2"]


def test_a_bad_record_close_to_the_size_limit_still_reaches_the_dead_letter_topic(
        bus: Bus, new_topic, new_group) -> None:
    """Its letter keeps a prefix with the size and digest, so it fits; processing goes on and
    a restart does not meet the record again (a whole copy did not fit: the runner raised, and
    raised again after every restart)."""
    import hashlib

    from astraflow.core.stream import DLQ_VALUE_BYTES

    src, dst, dlq = new_topic(), new_topic(), new_topic()
    poison = b"\xc1" + bytes(range(256)) * ((bus.max_message_bytes - 30_000) // 256)
    long_error = "x" * 100_000
    p = bus.producer()
    p.produce(src, poison, key=b"poison", headers=[("h", b"v" * 20_000)])
    p.produce(src, encode(task(1)), key=b"task-1")
    p.produce(src, encode(task(2)), key=b"task-2")
    p.flush()

    def copy(t: Task, _m: Message) -> list[Output]:
        if t.id == "task-2":
            raise RuntimeError(long_error)
        return [Output(dst, t)]

    group = new_group()
    stats = run_processor(bus, group=group, inputs=[src], kind=Task, handle=copy, dlq=dlq,
                          max_records=3, timeout=60)
    assert (stats.consumed, stats.produced, stats.dead_lettered) == (3, 1, 2)
    assert sum(bus.lag(group, src).values()) == 0
    c = bus.consumer(new_group(), [dlq])
    letters = {d.key: d for d in (decode(m.value, DeadLetter) for m in drain(c, 2, timeout=30))}
    c.close()
    big = letters[b"poison"]
    assert big.value == poison[:DLQ_VALUE_BYTES] and big.value_size == len(poison)
    assert big.value_digest == hashlib.sha256(poison).hexdigest()
    assert big.headers == [] and big.error_type == "SchemaError"
    assert len(letters[b"task-2"].error) < 5000 and letters[b"task-2"].value_size > 0
    again = run_processor(bus, group=group, inputs=[src], kind=Task, handle=copy, dlq=dlq,
                          max_records=1, timeout=2)
    assert again.consumed == 0


def test_large_record_error_names_the_limit_and_the_fix(bus: Bus, new_topic) -> None:
    topic = new_topic()
    p = bus.producer()
    with pytest.raises(RecordTooLargeError) as err:
        p.produce(topic, b"x" * 2_000_000)
    text = str(err.value)
    assert "2000000" in text or "2,000,000" in text
    assert "1000000" in text or "1,000,000" in text
    assert "weight store" in text
    p.produce(topic, b"y" * 900_000)  # under the limit: fine
    p.flush()
    p.close()


def test_topic_errors(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=2)
    bus.create_topics({topic: 2})  # same count: fine
    with pytest.raises(TopicError, match=topic):
        bus.create_topics({topic: 3})
    with pytest.raises(TopicError):
        bus.create_topics({topic: 2}, exist_ok=False)
    assert bus.list_topics()[topic] == 2
    p = bus.producer()
    with pytest.raises(TopicError, match="no-such-topic"):
        p.produce("no-such-topic-xyz", b"v")
    with pytest.raises(TopicError):
        p.produce(topic, b"v", partition=5)
    p.close()
    with pytest.raises(TopicError):
        bus.describe_topic("no-such-topic-xyz")
    with pytest.raises(TopicError, match="no-such-topic-xyz"):
        bus.consumer("g", [topic, "no-such-topic-xyz"])


# -- commit is partial by partition (types.Consumer.commit) --------------------------------------

def _take_half(bus: Bus, topic: str, group: str, n_parts: int) -> tuple[Consumer, Consumer,
                                                                        list[Message], list]:
    """``a`` is delivered every record (nothing committed), then ``b`` joins and takes some of
    a's partitions. Returns a, b, what a was delivered and what a was revoked."""
    revoked: list[tuple[str, int]] = []
    a = bus.consumer(group, [topic], client_id="a", session_timeout=6, on_revoke=revoked.extend)
    delivered: list[Message] = []
    wait_until(lambda: {m.partition for m in delivered} == set(range(n_parts)), 30,
               "records of every partition", tick=lambda: delivered.extend(a.consume(100, 0.1)))
    b = bus.consumer(group, [topic], client_id="b", session_timeout=6)
    wait_until(lambda: bool(revoked) and bool(b.assignment()), 45, "b to take partitions",
               tick=lambda: (a.poll(0.05), b.poll(0.05)))
    return a, b, delivered, revoked


def test_commit_commits_what_is_owned_and_names_only_the_lost(bus: Bus, new_topic,
                                                              new_group) -> None:
    topic, group = new_topic(partitions=4), new_group()
    produce_tasks(bus, topic, range(40))
    a, b, delivered, revoked = _take_half(bus, topic, group, 4)
    kept = {p for _, p in a.assignment()}
    moved = {p for _, p in revoked}
    assert kept and moved and not kept & moved
    with pytest.raises(CommitError) as err:
        a.commit(delivered)
    named = {p for p in range(4) if f"{topic}[{p}]" in str(err.value)}
    assert named == moved, "only the partitions a lost are named"
    last = {m.partition: m.offset + 1 for m in delivered}
    assert bus.committed(group, topic) == {p: last[p] for p in kept}, "the owned ones committed"
    a.commit()  # the lost partitions were reported once: nothing left to refuse
    b.close()
    a.close()


def test_commit_of_delivered_records_names_partitions_lost_before_it(bus: Bus, new_topic,
                                                                     new_group) -> None:
    topic, group = new_topic(partitions=4), new_group()
    produce_tasks(bus, topic, range(40))
    a, b, delivered, revoked = _take_half(bus, topic, group, 4)
    kept = {p for _, p in a.assignment()}
    with pytest.raises(CommitError) as err:
        a.commit()  # everything delivered: some of it from partitions a no longer owns
    named = {p for p in range(4) if f"{topic}[{p}]" in str(err.value)}
    assert named == {p for _, p in revoked}
    last = {m.partition: m.offset + 1 for m in delivered}
    assert bus.committed(group, topic) == {p: last[p] for p in kept}
    a.commit()  # reported once
    b.close()
    a.close()


def test_a_partition_lost_and_regained_is_redelivered_not_an_error(bus: Bus, new_topic,
                                                                   new_group) -> None:
    """What a session expiry during a broker restart looks like to the member: its partitions
    go and come back. Nothing is lost, the records come again, commits work at once."""
    topic, group = new_topic(partitions=4), new_group()
    produce_tasks(bus, topic, range(40))
    a, b, delivered, revoked = _take_half(bus, topic, group, 4)
    b.close()
    again: list[Message] = []
    wait_until(lambda: len(a.assignment()) == 4, 45, "a to own every partition again",
               tick=lambda: again.extend(a.consume(100, 0.05)))
    wait_until(lambda: {m.partition for m in again} >= {p for _, p in revoked}, 30,
               "the regained partitions' records again",
               tick=lambda: again.extend(a.consume(100, 0.05)))
    a.commit()  # no CommitError: every partition it delivered from is its own again
    assert sum(bus.lag(group, topic).values()) == 0
    ids = [decode(m.value, Task).id for m in delivered + again]
    assert set(ids) == {f"task-{i}" for i in range(40)}
    assert {decode(m.value, Task).id for m in again} == {
        decode(m.value, Task).id for m in delivered if (topic, m.partition) in revoked}
    a.close()


# -- the group-less reader (types.Reader) --------------------------------------------------------

def _group_traces(bus: Bus) -> object:
    """Everything consumer groups leave on the bus, to show that readers leave nothing."""
    if bus.url.startswith("embedded://"):
        import sqlite3

        conn = sqlite3.connect(bus.url.removeprefix("embedded://"))
        try:
            return {table: conn.execute(f"SELECT grp, {cols} FROM {table} ORDER BY 1, 2, 3"
                                        ).fetchall()
                    for table, cols in (("group_members", "member_id, topics"),
                                        ("group_owners", "topic, partition"),
                                        ("group_offsets", "topic, partition"),
                                        ("group_state", "generation, 0"))}
        finally:
            conn.close()
    listed = bus.admin.list_consumer_groups(request_timeout=30).result()  # type: ignore[attr-defined]
    return sorted(g.group_id for g in listed.valid)


def _values(msgs: list[Message]) -> list[tuple[int, str]]:
    return [(m.partition, decode(m.value, Task).id) for m in msgs]


def _read(reader, n: int, timeout: float = 30.0) -> list[Message]:  # noqa: ANN001
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out.extend(reader.consume(n - len(out), 0.5))
    return out


def test_reader_reads_every_partition_from_earliest(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=4)
    produce_tasks(bus, topic, range(60))
    ends = bus.describe_topic(topic).end_offsets
    r = bus.reader(topic)
    assert (r.topic, r.partitions) == (topic, 4)
    got = _read(r, 60)
    assert r.consume(100, 0.3) == [], "nothing beyond what exists"
    r.close()
    r.close()  # idempotent
    assert sorted(decode(m.value, Task).id for m in got) == sorted(f"task-{i}" for i in range(60))
    for p in range(4):
        assert [m.offset for m in got if m.partition == p] == list(range(ends[p]))
    assert all(m.origin == f"{topic}[{m.partition}]@{m.offset}" for m in got)


def test_reader_from_latest_and_from_offsets(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=3)
    produce_tasks(bus, topic, range(30))
    ends = bus.describe_topic(topic).end_offsets
    latest = bus.reader(topic, start="latest")
    assert [latest.position(p) for p in range(3)] == [ends[p] for p in range(3)]
    assert latest.consume(100, 0.3) == []
    produce_tasks(bus, topic, range(30, 36))  # produced after reader() returned: delivered
    assert sorted(decode(m.value, Task).id for m in _read(latest, 6)) == sorted(
        f"task-{i}" for i in range(30, 36))
    latest.close()
    p1 = max(range(3), key=lambda p: ends[p])
    start = {p1: ends[p1] - 2}  # the others start at the earliest
    r = bus.reader(topic, start=start)
    got = _read(r, sum(ends.values()) + 6 - (ends[p1] - 2))
    assert [m.offset for m in got if m.partition == p1][:2] == [ends[p1] - 2, ends[p1] - 1]
    assert all(m.offset >= ends[p1] - 2 for m in got if m.partition == p1)
    assert {m.offset for m in got if m.partition != p1} >= {0}
    r.close()


def test_reader_seek_and_position(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=2)
    p = bus.producer()
    for i in range(10):
        p.produce(topic, encode(task(i)), partition=0)
    p.flush()
    r = bus.reader(topic)
    assert (r.position(0), r.position(1)) == (0, 0)
    first = _read(r, 10)
    assert r.position(0) == 10 and [m.offset for m in first] == list(range(10))
    r.seek(0, 7)
    assert r.position(0) == 7
    assert [m.offset for m in _read(r, 3)] == [7, 8, 9], "read again from the sought offset"
    r.seek(0, 10)  # the end: fine, waits for the next record
    with pytest.raises(BusError, match=r"offset 11 is outside"):
        r.seek(0, 11)
    with pytest.raises(BusError, match="no partition 5"):
        r.seek(5, 0)
    with pytest.raises(BusError, match="no partition 5"):
        r.position(5)
    r.close()


def test_reader_errors_name_the_bad_value(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=2)
    produce_tasks(bus, topic, range(4))
    with pytest.raises(TopicError, match="no-such-topic-xyz"):
        bus.reader("no-such-topic-xyz")
    with pytest.raises(BusError, match=r"start='middle'.*earliest, latest"):
        bus.reader(topic, start="middle")
    end0 = bus.describe_topic(topic).end_offsets[0]
    with pytest.raises(BusError) as err:
        bus.reader(topic, start={0: end0 + 1, 7: 0})
    assert f"offset {end0 + 1} is outside {topic}[0]" in str(err.value)
    assert "no partition 7" in str(err.value)


def test_read_all_reads_what_exists_now_and_stops(bus: Bus, new_topic) -> None:
    topic = new_topic(partitions=3)
    assert list(read_all(bus, topic)) == []  # empty: returns at once
    produce_tasks(bus, topic, range(30))
    got = []
    for m in read_all(bus, topic, idle_timeout=30):
        if not got:  # produced while reading: not part of "now"
            produce_tasks(bus, topic, range(30, 40))
        got.append(m)
    assert sorted(decode(m.value, Task).id for m in got) == sorted(f"task-{i}" for i in range(30))


def test_reader_joins_no_group_and_leaves_nothing(bus: Bus, new_topic, new_group) -> None:
    topic, group = new_topic(partitions=4), new_group()
    produce_tasks(bus, topic, range(40))
    revoked: list[tuple[str, int]] = []
    member = bus.consumer(group, [topic], client_id="member", session_timeout=6,
                          on_revoke=revoked.extend)
    wait_until(lambda: len(member.assignment()) == 4, 30, "the member to own every partition",
               tick=lambda: member.poll(0.05))
    member.commit()
    committed = bus.committed(group, topic)
    before = _group_traces(bus)
    readers = [bus.reader(topic, client_id=f"r{i}") for i in range(3)]
    for r in readers:  # each reads everything: nothing is shared between readers
        assert len(_read(r, 40)) == 40
    # A group member meanwhile keeps every partition: readers are not members of anything.
    for _ in range(10):
        member.poll(0.05)
    assert len(member.assignment()) == 4 and not revoked
    for r in readers:
        r.close()
    assert _group_traces(bus) == before, "no group, member, ownership or offset was written"
    assert bus.committed(group, topic) == committed
    member.close()
