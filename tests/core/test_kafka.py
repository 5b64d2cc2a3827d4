"""Kafka-only behaviour: a broker restart mid-stream, key routing, size limits on both sides of
the wire, the broker's jars and state file. The bus semantics both backends share are in
test_bus_conformance.py."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner
from waiting import wait_for as wait_until

from astraflow.cli.broker import app as broker_cli
from astraflow.core.broker import LocalBroker, fetch_jars, jars_dir
from astraflow.core.bus import Message, connect
from astraflow.core.bus.kafka import KafkaBus
from astraflow.core.bus.partitioner import partition_for
from astraflow.core.errors import BusError, CommitError, RecordTooLargeError

pytestmark = pytest.mark.kafka


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def kbus(kafka_bootstrap: str) -> Iterator[KafkaBus]:
    bus = connect(f"kafka://{kafka_bootstrap}")
    assert isinstance(bus, KafkaBus)
    yield bus
    bus.close()


@pytest.mark.timeout(600)  # its waits add up past the default 300 s on a busy host
def test_broker_restart_mid_stream_loses_no_record(local_kafka_broker: LocalBroker,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The broker restarts while a producer and a consumer run. The contract (types.py): every
    record whose flush returned is delivered at least once. It also allows what a restart may
    cause: commits that fail while the broker is down (BusError) or are refused because the
    member's session expired meanwhile and its partitions were lost (CommitError), and the
    redelivery of uncommitted records that follows. Those are counted, not failures; once the
    broker is back, commits work again (the group's lag reaches 0)."""
    caplog.set_level(logging.WARNING, logger="astraflow.bus.kafka")
    bus = connect(f"kafka://{local_kafka_broker.bootstrap}")
    topic, group = uid("restart"), uid("g")
    bus.create_topics({topic: 3})
    durable: list[str] = []  # ids whose flush returned
    phase_of: dict[str, str] = {}
    phase = ["before"]
    stop = threading.Event()
    failures: list[BaseException] = []

    def produce_forever() -> None:
        p = bus.producer(client_id="restart-producer")
        i = 0
        try:
            while not stop.is_set():
                batch = [f"r{i + j}" for j in range(10)]
                for rid in batch:
                    phase_of[rid] = phase[0]
                    p.produce(topic, rid.encode(), key=rid.encode())
                p.flush(60)
                durable.extend(batch)
                i += len(batch)
                stop.wait(0.01)  # pacing only
            p.close()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    seen: Counter[str] = Counter()
    refused: Counter[str] = Counter()  # commits the contract allows to fail, by error type
    c = bus.consumer(group, [topic], client_id="restart-consumer", session_timeout=10)

    def commit(batch: list[Message] | None) -> None:
        try:
            c.commit(batch)
        except BusError as e:  # CommitError included: the records are delivered again
            refused[type(e).__name__] += 1

    def pump() -> None:
        batch = c.consume(200, 0.1)
        seen.update(m.value.decode() for m in batch)
        if batch:
            commit(batch)
        assert not failures, failures

    restart_failed: list[BaseException] = []

    def restart_broker() -> None:
        try:
            local_kafka_broker.restart(timeout=120)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            restart_failed.append(e)

    producer = threading.Thread(target=produce_forever, daemon=True)
    producer.start()
    restart: threading.Thread | None = None
    try:
        wait_until(lambda: len(durable) >= 100 and len(seen) >= 50, 30, "records before",
                   tick=pump)
        phase[0] = "during"
        pid_before = local_kafka_broker.status().pid
        restart = threading.Thread(target=restart_broker, daemon=True)
        restart.start()
        while restart.is_alive():
            pump()
        restart.join()
        assert not restart_failed, restart_failed
        assert local_kafka_broker.status().pid not in (None, pid_before), "a new JVM runs"
        phase[0] = "after"
        n_after_restart = len(durable)
        wait_until(lambda: len(durable) >= n_after_restart + 100, 60, "records after", tick=pump)
        stop.set()
        producer.join(60)
        assert not producer.is_alive() and not failures, failures
        # A member whose session expired during the restart rejoins, and the coordinator may
        # hold the rebalance for the old member's session: allow two minutes, then say where
        # the consumer stands (assignment, lag) so a stall can be told from a slow rejoin.
        wait_until(lambda: set(durable) <= set(seen), 120,
                   lambda: (f"every durable record: {len(set(durable) - set(seen))} of "
                            f"{len(durable)} unseen; assignment={c.assignment()} "
                            f"lag={bus.lag(group, topic)} refused={dict(refused)}"),
                   tick=pump)
        # Commits work again: whatever is still uncommitted (including records redelivered
        # after a lost assignment) gets committed within a bounded time.
        wait_until(lambda: sum(bus.lag(group, topic).values()) == 0, 60,
                   "the group's lag to reach 0 after the restart",
                   tick=lambda: (pump(), commit(None)))
    finally:
        stop.set()
        c.close()
        # the session's later Kafka tests need the broker: never leave it down
        if restart is not None:
            restart.join(150)
        if not local_kafka_broker.status().running:
            local_kafka_broker.start(timeout=120)
    lost = set(durable) - set(seen)
    duplicates = sum(n - 1 for n in seen.values())
    phases = Counter(phase_of[r] for r in durable)
    print(f"records={len(durable)} phases={dict(phases)} duplicates={duplicates} "
          f"refused_commits={dict(refused)}")
    assert not lost
    assert phases["before"] and phases["during"] and phases["after"]
    # The connection-refused stream while the broker was down is rate-limited per client.
    noisy = [r for r in caplog.records if r.name == "astraflow.bus.kafka"]
    assert len(noisy) < 30, [r.getMessage() for r in noisy]
    bus.close()


def test_keys_route_like_partition_for(kbus: KafkaBus) -> None:
    topic = uid("route")
    kbus.create_topics({topic: 16})
    keys = [f"key-{i}".encode() for i in range(300)] + [b"", b"\x00\xff", "ключ".encode()]
    p = kbus.producer()
    for k in keys:
        p.produce(topic, b"v", key=k)
    p.flush()
    c = kbus.consumer(uid("g"), [topic])
    got = []
    wait_until(lambda: len(got) >= len(keys), 30, "all keyed records",
               tick=lambda: got.extend(c.consume(500, 0.2)))
    c.close()
    assert len(got) == len(keys)
    for m in got:
        assert m.partition == partition_for(m.key, 16), m.key
    assert len({m.partition for m in got}) == 16


def test_record_too_large_on_either_side(kbus: KafkaBus) -> None:
    # Client side: refused at produce() with the size, the limit and the fix.
    topic = uid("size")
    kbus.create_topics({topic: 1})
    p = kbus.producer()
    with pytest.raises(RecordTooLargeError) as err:
        p.produce(topic, b"x" * 1_000_001)
    assert "1,000,001" in str(err.value) and "1,000,000" in str(err.value)
    assert "weight store" in str(err.value) and "max_message_bytes" in str(err.value)

    # Broker side: a topic with a small max.message.bytes refuses the record at flush().
    small = uid("small")
    from confluent_kafka.admin import NewTopic

    fut = kbus.admin.create_topics([NewTopic(small, 1, 1, config={"max.message.bytes": "4096"})])
    fut[small].result()
    p.produce(small, os.urandom(20_000))  # incompressible, under the bus's own limit
    with pytest.raises(RecordTooLargeError) as err:
        p.flush(30)
    text = str(err.value)
    assert "20,000" in text and "4,096" in text and "weight store" in text, text
    p.produce(small, b"fits")  # the producer goes on
    p.flush(30)
    p.close()


def test_raised_max_message_bytes_is_honoured_end_to_end(kafka_bootstrap: str) -> None:
    bus = connect(f"kafka://{kafka_bootstrap}", max_message_bytes=3_000_000)
    topic = uid("big")
    bus.create_topics({topic: 1})  # created with a matching max.message.bytes
    payload = os.urandom(2_500_000)
    p = bus.producer()
    p.produce(topic, payload, key=b"big")
    p.flush(30)
    p.close()
    c = bus.consumer(uid("g"), [topic])
    got = []
    wait_until(lambda: bool(got), 30, "the large record", tick=lambda: got.extend(c.consume(1)))
    c.close()
    assert got[0].value == payload
    bus.close()


def test_commit_after_losing_the_partition_raises_commit_error(kbus: KafkaBus) -> None:
    topic, group = uid("rebal"), uid("g")
    kbus.create_topics({topic: 2})
    p = kbus.producer()
    for i in range(20):
        p.produce(topic, str(i).encode(), partition=i % 2)
    p.flush()
    revoked: list[tuple[str, int]] = []
    a = kbus.consumer(group, [topic], client_id="a", session_timeout=6,
                      on_revoke=revoked.extend)
    delivered = []
    wait_until(lambda: {m.partition for m in delivered} == {0, 1}, 30, "records of both",
               tick=lambda: delivered.extend(a.consume(100, 0.1)))
    b = kbus.consumer(group, [topic], client_id="b", session_timeout=6)
    wait_until(lambda: bool(revoked) and bool(b.assignment()), 30, "b to take a partition",
               tick=lambda: (a.poll(0.05), b.poll(0.05)))
    moved = revoked[0]
    assert moved not in a.assignment()
    with pytest.raises(CommitError, match=rf"{topic}\[{moved[1]}\]"):
        a.commit(delivered)
    kept = [m for m in delivered if (m.topic, m.partition) in a.assignment()]
    assert kept, "the partition a still owns was committed"
    assert kbus.committed(group, topic).get(kept[0].partition) == kept[-1].offset + 1
    a.close()
    b.close()


def test_fetch_jars_is_idempotent_and_instant_once_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from astraflow.core.broker import jars

    first = fetch_jars()

    def no_process(*args: object, **_: object) -> None:
        raise AssertionError(f"fetch_jars ran {args} once the jars were there")

    # once done, nothing runs: no mvn, no java (instant, whatever the machine's speed)
    monkeypatch.setattr(jars.subprocess, "run", no_process)
    monkeypatch.setattr(jars.shutil, "which", no_process)
    again = fetch_jars()
    assert first == again == jars_dir()
    assert any(first.glob("kafka_2.13-*.jar")) and any(first.glob("log4j-slf4j2-impl-*.jar"))


def test_broker_state_file_lets_another_process_attach(local_kafka_broker: LocalBroker) -> None:
    st = local_kafka_broker.status()
    assert st.running and st.bootstrap == local_kafka_broker.bootstrap
    other = LocalBroker.attach(local_kafka_broker.data_dir)
    assert other.status() == st
    assert (other.port, other.controller_port) == (local_kafka_broker.port,
                                                   local_kafka_broker.controller_port)
    out = CliRunner().invoke(broker_cli, ["status", "--dir", str(local_kafka_broker.data_dir)])
    assert out.exit_code == 0, out.output
    assert f"running (pid {st.pid})" in out.output and st.bootstrap in out.output


@pytest.mark.skipif(bool(os.environ.get("ASTRAFLOW_KAFKA_BOOTSTRAP")),
                    reason="ASTRAFLOW_KAFKA_BOOTSTRAP is set: no local broker is started")
def test_cli_starts_and_stops_a_broker(tmp_path_factory: pytest.TempPathFactory) -> None:
    data = tmp_path_factory.mktemp("cli-broker")
    free = LocalBroker(data)  # two free ports; writes nothing
    port = free.port
    cli = CliRunner()
    out = cli.invoke(broker_cli, ["start", "--dir", str(data), "--port", str(port),
                                  "--controller-port", str(free.controller_port),
                                  "--jvm-flags", "-XX:+UseSerialGC -XX:-UsePerfData"])
    try:
        assert out.exit_code == 0, out.output
        # the flags given reach the JVM, in place of the default ones
        pid = LocalBroker.attach(data).pid()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"-XX:+UseSerialGC" in argv and b"-XX:-UsePerfData" in argv, argv
        assert b"-XX:TieredStopAtLevel=1" not in argv, argv
        assert f"--bus kafka://127.0.0.1:{port}" in out.output
        bus = connect(f"kafka://127.0.0.1:{port}")
        assert isinstance(bus.list_topics(), dict)
        bus.close()
        again = cli.invoke(broker_cli, ["start", "--dir", str(data)])
        assert again.exit_code == 0 and "already running" in again.output
    finally:
        out = cli.invoke(broker_cli, ["stop", "--dir", str(data)])
    assert out.exit_code == 0 and "stopped" in out.output, out.output
    out = cli.invoke(broker_cli, ["status", "--dir", str(data)])
    assert out.exit_code == 1 and "stopped" in out.output



def round_trips(listener: dict[str, str]) -> None:
    """Settings given in connect()'s config or in the URL's query string reach the admin
    client, producers and consumers of ``listener`` (``bootstrap`` and client settings)."""
    from urllib.parse import urlencode

    settings = {k: v for k, v in listener.items() if k != "bootstrap"}
    url = f"kafka://{listener['bootstrap']}"
    for bus in (connect(url, config=settings), connect(f"{url}?{urlencode(settings)}")):
        topic = f"sec-{uuid.uuid4().hex[:8]}"
        bus.create_topics({topic: 1})
        p = bus.producer()
        p.produce(topic, b"v", key=b"k")
        p.flush()
        p.close()
        group = f"g-{uuid.uuid4().hex[:8]}"
        c = bus.consumer(group, [topic], session_timeout=6)
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = c.consume(1, 0.5)
        c.commit(got)
        c.close()
        assert [m.value for m in got] == [b"v"]
        assert bus.committed(group, topic) == {0: 1}
        bus.close()


def test_sasl_settings_reach_every_kafka_client(kafka_sasl: dict[str, str]) -> None:
    """The session broker's SASL_PLAINTEXT listener (PLAIN) takes only its users: settings
    given in connect()'s config or in the URL's query string reach the admin client,
    producers and consumers."""
    round_trips(kafka_sasl)


def test_ssl_settings_reach_every_kafka_client(kafka_ssl: dict[str, str]) -> None:
    """The session broker's SSL listener (a keystore made by keytool at the session's start):
    ``security.protocol=SSL`` and ``ssl.ca.location`` (the certificate that the client trusts)
    reach the admin client, producers and consumers, over TLS."""
    round_trips(kafka_ssl)


def test_a_client_that_does_not_trust_the_brokers_certificate_is_refused(
        kafka_ssl: dict[str, str]) -> None:
    """Without the broker's certificate among those it trusts (the system's CAs only), the
    client refuses the TLS connection: a BusError that names the failed certificate check and
    ssl.ca.location (the handshake failure ends the metadata retries, as an authentication
    failure does), and no plaintext fallback."""
    settings = {k: v for k, v in kafka_ssl.items() if k not in ("bootstrap", "ssl.ca.location")}
    bus = connect(f"kafka://{kafka_ssl['bootstrap']}", config=settings)
    try:
        with pytest.raises(BusError, match="authentication failed .*certificate verify "
                                           "failed.*ssl.ca.location"):
            bus.create_topics({f"ssl-{uuid.uuid4().hex[:8]}": 1})
    finally:
        bus.close()


def test_a_wrong_sasl_password_is_a_bus_error_naming_authentication(
        kafka_sasl: dict[str, str]) -> None:
    settings = {k: v for k, v in kafka_sasl.items() if k != "bootstrap"}
    bus = connect(f"kafka://{kafka_sasl['bootstrap']}",
                  config={**settings, "sasl.password": "wrong"})
    try:
        with pytest.raises(BusError, match="authentication failed .*check security.protocol"):
            bus.create_topics({f"sasl-{uuid.uuid4().hex[:8]}": 1})
    finally:
        bus.close()
