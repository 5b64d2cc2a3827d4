"""The emulated WAN (bench/lib/wan.py): Toxiproxy links really delay and cap traffic, a weight
download cut mid-way resumes and ends bit-exact, and Kafka works through a proxied listener.

Needs ``toxiproxy-server`` (scripts/install-toxiproxy.sh); skipped without it. Timing checks
are lower bounds and orderings only: a loaded machine makes things slower, never faster.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from astraflow.core.broker import LocalBroker
from astraflow.core.bus import connect
from astraflow.core.errors import WeightStoreError
from astraflow.weights.http import HttpStore, make_server
from astraflow.weights.store import download
from bench.lib.wan import (
    INSTALL_HINT,
    Link,
    Toxiproxy,
    WanError,
    find_toxiproxy,
    link_toxics,
)

RTT_S = 0.3


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def connect_to(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trip(sock: socket.socket, payload: bytes) -> float:
    start = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "the echo connection closed"
        got += chunk
    assert got == payload
    return time.monotonic() - start


def best_round_trip(address: str, payload: bytes = b"ping", tries: int = 3) -> float:
    with connect_to(address) as sock:
        return min(round_trip(sock, payload) for _ in range(tries))


# ---- without a server


def test_link_toxics_split_the_rtt_and_convert_bytes_to_toxiproxy_kb() -> None:
    toxics = {t["name"]: t for t in link_toxics(
        Link(rtt_ms=300, jitter_ms=40, bandwidth_bytes_per_s=2_500_000))}
    for stream in ("upstream", "downstream"):
        latency, bandwidth = toxics[f"link_latency_{stream}"], toxics[f"link_bandwidth_{stream}"]
        assert (latency["type"], latency["stream"]) == ("latency", stream)
        assert latency["attributes"] == {"latency": 150, "jitter": 20}
        assert bandwidth["attributes"] == {"rate": 2500}  # Toxiproxy's KB/s: 1000 bytes/s
    assert link_toxics(Link()) == []


@pytest.mark.parametrize(("link", "error"), [
    ({"rtt_ms": -1}, "must be >= 0"),
    ({"rtt_ms": 10, "jitter_ms": 20}, "must not exceed its rtt_ms"),
    ({"bandwidth_bytes_per_s": 999}, "must be >= 1000"),
])
def test_bad_links_are_refused(link: dict[str, float], error: str) -> None:
    with pytest.raises(WanError, match=error):
        Link(**link)  # type: ignore[arg-type]


def test_missing_binary_names_the_install_command(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ASTRAFLOW_TOXIPROXY", raising=False)
    assert find_toxiproxy() is None
    with pytest.raises(WanError) as err, Toxiproxy():
        pass
    assert "toxiproxy-server not found" in str(err.value) and INSTALL_HINT in str(err.value)
    assert "scripts/install-toxiproxy.sh" in INSTALL_HINT


# ---- through Toxiproxy


def test_api_refusals_carry_the_status_and_body(toxiproxy: Toxiproxy, echo_server: str) -> None:
    name = f"dup-{uuid.uuid4().hex[:8]}"
    proxy = toxiproxy.proxy(name, upstream=echo_server)
    try:
        with pytest.raises(WanError, match=r"HTTP 409 .*proxy already exists"):
            toxiproxy.proxy(name, upstream=echo_server)
        with pytest.raises(WanError, match=r"HTTP 400 .*invalid toxic type"):
            proxy.add_toxic("no_such_toxic")
        with pytest.raises(WanError, match="unknown stream 'sideways'.*valid: upstream"):
            proxy.add_toxic("latency", stream="sideways", latency=1)
    finally:
        proxy.delete()


def test_a_300ms_link_delays_every_round_trip_and_removing_it_restores_speed(
        toxiproxy: Toxiproxy, echo_server: str) -> None:
    proxy = toxiproxy.proxy(f"rtt-{uuid.uuid4().hex[:8]}", upstream=echo_server,
                            link=Link(rtt_ms=RTT_S * 1000))
    try:
        direct = best_round_trip(echo_server)
        linked = best_round_trip(proxy.listen)
        assert linked >= RTT_S - 0.05, (linked, direct)
        assert direct < linked
        proxy.apply(Link())  # no link: the toxics go
        assert proxy.toxics() == []
        assert best_round_trip(proxy.listen) < linked
    finally:
        proxy.delete()


def test_a_disabled_proxy_refuses_connections_until_enabled(toxiproxy: Toxiproxy,
                                                             echo_server: str) -> None:
    proxy = toxiproxy.proxy(f"down-{uuid.uuid4().hex[:8]}", upstream=echo_server)
    try:
        with connect_to(proxy.listen) as sock:
            round_trip(sock, b"up")
            proxy.disable()
            sock.settimeout(10)
            assert sock.recv(10) == b""  # the open connection was dropped
        with pytest.raises(ConnectionRefusedError):
            connect_to(proxy.listen)
        proxy.enable()
        assert best_round_trip(proxy.listen) > 0
    finally:
        proxy.delete()


def test_a_bandwidth_link_caps_throughput(toxiproxy: Toxiproxy, echo_server: str) -> None:
    size, rate = 400_000, 500_000  # 0.8 s at the cap
    proxy = toxiproxy.proxy(f"bw-{uuid.uuid4().hex[:8]}", upstream=echo_server,
                            link=Link(bandwidth_bytes_per_s=rate))
    try:
        with connect_to(proxy.listen) as sock:
            took = round_trip(sock, os.urandom(size))
        assert took >= 0.75 * size / rate, took
    finally:
        proxy.delete()


def test_a_download_cut_mid_way_resumes_from_the_part_file_and_ends_bit_exact(
        toxiproxy: Toxiproxy, tmp_path: Path) -> None:
    blob = os.urandom(4 << 20)
    root = tmp_path / "store"
    (root / "solver").mkdir(parents=True)
    (root / "solver" / "v0000000001.afw").write_bytes(blob)
    server = make_server(root)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = server.url.removeprefix("http://")
    # ~1 MB/s: the first megabyte takes about a second, the whole blob four.
    proxy = toxiproxy.proxy(f"weights-{uuid.uuid4().hex[:8]}", upstream=upstream,
                            link=Link(rtt_ms=50, bandwidth_bytes_per_s=1_000_000))
    store = HttpStore(f"http://{proxy.listen}", timeout=10)
    dest = tmp_path / "worker" / "v0000000001.afw"
    part = dest.with_name(dest.name + ".part")
    errors: list[BaseException] = []

    def first() -> None:
        try:
            download(store, "solver/v0000000001.afw", dest)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    try:
        t = threading.Thread(target=first, daemon=True)
        t.start()
        wait_for(lambda: part.exists() and part.stat().st_size >= 1 << 20, 30,
                 "the first megabyte")
        proxy.cut()  # the open connection drops mid-body
        t.join(30)
        assert not t.is_alive(), "the download did not notice the cut"
        assert len(errors) == 1 and isinstance(errors[0], WeightStoreError), errors
        assert "call again to resume" in str(errors[0])
        have = part.stat().st_size
        assert 0 < have < len(blob) and not dest.exists()

        with pytest.raises(WeightStoreError):  # still cut: nothing gets through
            download(store, "solver/v0000000001.afw", dest)
        assert part.stat().st_size == have

        proxy.restore()
        proxy.apply(Link(rtt_ms=50, bandwidth_bytes_per_s=20_000_000))  # finish quickly
        moved = download(store, "solver/v0000000001.afw", dest)
        assert moved == len(blob) - have < len(blob)  # resumed, not restarted
        assert dest.read_bytes() == blob
        assert not part.exists()
    finally:
        proxy.delete()
        server.shutdown()
        server.server_close()


# ---- Kafka through a proxied listener


@pytest.mark.kafka
def test_kafka_records_cross_a_300ms_link_intact_and_in_order(
        wan_kafka: tuple[LocalBroker, str]) -> None:
    broker, via_proxy = wan_kafka
    # With the far-link settings docs/wan.md recommends, passed in the URL.
    bus = connect(f"kafka://{via_proxy}?linger.ms=50&max.partition.fetch.bytes=8388608"
                  "&socket.keepalive.enable=true")
    try:
        # The broker advertises the proxy on this listener: no connection bypasses the link.
        brokers = bus.admin.list_topics(timeout=30).brokers  # type: ignore[attr-defined]
        assert [f"{b.host}:{b.port}" for b in brokers.values()] == [via_proxy]
        assert via_proxy != broker.bootstrap

        topic, group = f"wan-{uuid.uuid4().hex[:12]}", f"g-{uuid.uuid4().hex[:12]}"
        bus.create_topics({topic: 1})
        sent = [(f"k{i % 3}".encode(), os.urandom(1000) + i.to_bytes(4, "big"))
                for i in range(30)]
        producer = bus.producer()
        start = time.monotonic()
        for key, value in sent:
            producer.produce(topic, value, key=key)
        producer.flush(60)
        assert time.monotonic() - start >= RTT_S - 0.05  # a produce round trip crossed the link
        producer.close()

        consumer = bus.consumer(group, [topic], start="earliest", session_timeout=30)
        got: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += [(m.key, m.value) for m in consumer.consume(100, timeout=1.0)]
        consumer.commit()
        consumer.close()
        assert got == sent
    finally:
        bus.close()
