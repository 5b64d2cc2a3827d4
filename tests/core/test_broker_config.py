"""The local broker's configuration and error messages, without starting a JVM."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.cli.broker import app as broker_cli
from astraflow.core.broker import LocalBroker, fetch_jars, kafka_version, require_java
from astraflow.core.broker.jars import INSTALL_HINT, java_major
from astraflow.core.broker.local import DEV_JVM_FLAGS
from astraflow.core.errors import BrokerError


def read_properties(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def test_server_properties_for_one_kraft_node(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path / "b", port=19092, controller_port=19093)
    b.write_config()
    props = read_properties(b.config_file)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path / "b" / "kraft")
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "share.coordinator.state.topic.replication.factor",
                "share.coordinator.state.topic.min.isr"):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.min.session.timeout.ms"] == "1000"
    assert props["num.partitions"] == "1"
    assert b.bootstrap == "127.0.0.1:19092"
    log4j = (tmp_path / "b" / "log4j2.properties").read_text()
    assert f"fileName = {b.log_file}" in log4j and "@LOG_FILE@" not in log4j
    assert "rootLogger.level = WARN" in log4j


def test_extra_listeners_bind_one_port_and_advertise_another(tmp_path: Path) -> None:
    # A region's proxy listens on 29000 and forwards to 19094: the broker must advertise the
    # proxy's address on that listener, so that clients which came in through it stay on it.
    b = LocalBroker(tmp_path / "b", port=19092, controller_port=19093,
                    extra_listeners={"REGION_B": (19094, "127.0.0.1:29000")})
    b.write_config()
    props = read_properties(b.config_file)
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,"
                                  "REGION_B://127.0.0.1:19094")
    assert props["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:19092,"
                                             "REGION_B://127.0.0.1:29000")
    assert props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REGION_B:PLAINTEXT")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert b.bootstrap == "127.0.0.1:19092"  # the broker's own clients keep the direct path
    # Kept in the state file, so a restart through attach() keeps the listener.
    b._write_state(None)
    assert LocalBroker.attach(tmp_path / "b").extra_listeners == {
        "REGION_B": (19094, "127.0.0.1:29000")}


def test_an_ssl_listener_serves_tls_from_a_pkcs12_keystore_and_is_kept(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path / "b", port=19092, controller_port=19093, ssl_port=19095,
                    ssl_keystore=tmp_path / "broker.p12", ssl_password="pw")
    b.write_config()
    props = read_properties(b.config_file)
    assert props["listeners"].endswith(",SSL://127.0.0.1:19095")
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092,SSL://127.0.0.1:19095"
    assert props["listener.security.protocol.map"].endswith(",SSL:SSL")
    assert props["listener.name.ssl.ssl.keystore.location"] == str(tmp_path / "broker.p12")
    assert props["listener.name.ssl.ssl.keystore.type"] == "PKCS12"
    assert props["listener.name.ssl.ssl.keystore.password"] == "pw"
    assert props["listener.name.ssl.ssl.key.password"] == "pw"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    b._write_state(None)  # a restart through attach() keeps the listener
    again = LocalBroker.attach(tmp_path / "b")
    assert (again.ssl_port, again.ssl_keystore, again.ssl_password) == (
        19095, tmp_path / "broker.p12", "pw")
    for bad in ({"ssl_port": 19095}, {"ssl_keystore": tmp_path / "k.p12"},
                {"ssl_port": 19095, "ssl_keystore": tmp_path / "k.p12"}):
        with pytest.raises(BrokerError, match="SSL listener needs ssl_port, ssl_keystore"):
            LocalBroker(tmp_path / "c", port=19092, controller_port=19093, **bad)
    with pytest.raises(BrokerError, match="SSL listener: port 19092 is already used by the "
                                          "broker"):
        LocalBroker(tmp_path / "c", port=19092, controller_port=19093, ssl_port=19092,
                    ssl_keystore=tmp_path / "k.p12", ssl_password="pw")


@pytest.mark.parametrize(("listeners", "error"), [
    ({"region-b": (19094, "127.0.0.1:29000")}, "bad extra listener name 'region-b'"),
    ({"CONTROLLER": (19094, "127.0.0.1:29000")}, "other than PLAINTEXT, CONTROLLER, SASL, SSL"),
    ({"WAN": (19094, "127.0.0.1")}, "'127.0.0.1' is not host:port"),
    ({"WAN": (19092, "127.0.0.1:29000")}, "port 19092 is already used by the broker"),
    ({"A": (19094, "h:1"), "B": (19094, "h:2")}, "port 19094 is already used by listener A"),
])
def test_bad_extra_listeners_are_refused(tmp_path: Path, listeners: dict[str, tuple[int, str]],
                                         error: str) -> None:
    with pytest.raises(BrokerError, match=re.escape(error)):
        LocalBroker(tmp_path, port=19092, controller_port=19093, extra_listeners=listeners)


def test_jvm_flags_default_to_the_light_ones_and_are_kept_in_the_state_file(
        tmp_path: Path) -> None:
    assert LocalBroker(tmp_path / "a").jvm_flags == DEV_JVM_FLAGS
    (tmp_path / "b").mkdir()
    b = LocalBroker(tmp_path / "b", jvm_flags=["-XX:+UseG1GC"])
    b._write_state(None)
    assert LocalBroker.attach(tmp_path / "b").jvm_flags == ("-XX:+UseG1GC",)
    assert LocalBroker(tmp_path / "b", jvm_flags=()).jvm_flags == ()  # the JVM's own defaults
    for bad in (["UseG1GC"], ["-Xmx2g"], ["-Xms1g"]):
        with pytest.raises(BrokerError, match="bad JVM flags"):
            LocalBroker(tmp_path / "c", jvm_flags=bad)


def test_free_ports_are_chosen_and_kept_in_the_state_file(tmp_path: Path) -> None:
    b = LocalBroker(tmp_path)
    assert b.port != b.controller_port and b.port > 0
    # As a broker started by another process leaves it (this pid is no broker: not running).
    (tmp_path / "broker.json").write_text(json.dumps(
        {"pid": os.getpid(), "port": 31001, "controller_port": 31002, "heap": "1g"}))
    attached = LocalBroker.attach(tmp_path)
    assert (attached.port, attached.controller_port, attached.heap) == (31001, 31002, "1g")
    st = attached.status()
    assert (st.running, st.pid, st.bootstrap) == (False, None, "127.0.0.1:31001")
    attached.stop()  # nothing to stop: a no-op that clears the pid
    assert json.loads((tmp_path / "broker.json").read_text())["pid"] is None


def test_attach_without_state_file_says_how_to_start(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="astraflow broker start --dir"):
        LocalBroker.attach(tmp_path)


def test_kafka_version_comes_from_the_pom() -> None:
    pom = (Path(__file__).parents[2] / "astraflow/core/broker/pom.xml").read_text()
    assert f"<kafka.version>{kafka_version()}</kafka.version>" in pom
    assert re.fullmatch(r"\d+\.\d+\.\d+", kafka_version())


@pytest.mark.parametrize(("text", "major"), [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("garbage", None),
])
def test_java_major(text: str, major: int | None) -> None:
    assert java_major(text) == major


def test_missing_maven_says_what_to_install(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))  # nothing fetched there
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrokerError) as err:
        fetch_jars()
    assert "`mvn` not found" in str(err.value) and INSTALL_HINT in str(err.value)
    with pytest.raises(BrokerError, match="`java` not found.*apt-get install -y openjdk-17"):
        require_java()


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(BrokerError) as err:
        require_java()
    assert "Java 17+" in str(err.value) and "1.8.0_392" in str(err.value)
    assert INSTALL_HINT in str(err.value)


def test_cli_reports_broker_errors_in_one_line_and_exit_code_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = CliRunner().invoke(broker_cli, ["start", "--dir", str(tmp_path / "b")])
    assert out.exit_code == 1
    assert "error:" in out.output and "not found" in out.output
    assert "Traceback" not in out.output
    out = CliRunner().invoke(broker_cli, ["status", "--dir", str(tmp_path / "none")])
    assert out.exit_code == 1 and "astraflow broker start" in out.output


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


JAVA_17 = """case "$*" in *-version*) echo 'openjdk version "17.0.9"' >&2; exit 0;; esac
"""


def test_maven_failure_shows_the_tail_of_its_output(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path / "bin", "java", JAVA_17)
    fake_tool(tmp_path / "bin", "mvn", "echo '[ERROR] Could not resolve kafka_2.13'; exit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BrokerError, match=r"(?s)mvn failed \(exit 1\).*Could not resolve"):
        fetch_jars()
    leftovers = list((tmp_path / "cache").rglob("*"))
    assert [p.name for p in leftovers] == [f"kafka-{kafka_version()}"], "no half-done fetch"


def test_start_fails_early_with_the_log_when_the_jvm_exits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A "JVM" that formats fine, then dies at once like a broker with a bad config.
    fake_tool(tmp_path / "bin", "java", JAVA_17 + """case "$*" in *StorageTool*) exit 0;; esac
echo "ERROR Exiting Kafka due to fatal exception: bad listener"; exit 3
""")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr("astraflow.core.broker.local.fetch_jars", lambda _p=None: tmp_path)
    b = LocalBroker(tmp_path / "b")
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*bad listener"):
        b.start(timeout=20)
    assert not b.status().running


def test_listener_flags_are_parsed_and_bad_ones_refused_in_one_line(tmp_path: Path) -> None:
    from astraflow.cli.broker import parse_listeners

    assert parse_listeners(["REGION_B=19093:wan-proxy.example:29093", "WAN=19094:h:1"]) == {
        "REGION_B": (19093, "wan-proxy.example:29093"), "WAN": (19094, "h:1")}
    for bad in ["REGION_B", "REGION_B=x:h:1", "REGION_B=19093", "REGION_B=19093:"]:
        with pytest.raises(BrokerError, match="expected NAME=BIND_PORT:ADVERTISED_HOST"):
            parse_listeners([bad])
    with pytest.raises(BrokerError, match="given twice"):
        parse_listeners(["A=1:h:1", "A=2:h:2"])
    out = CliRunner().invoke(broker_cli, ["start", "--dir", str(tmp_path / "b"),
                                          "--listener", "region-b=19093:h:1"])
    assert out.exit_code == 1 and "bad extra listener name 'region-b'" in out.output
    assert "Traceback" not in out.output
