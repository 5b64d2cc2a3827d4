"""A local single-node Apache Kafka (KRaft, broker + controller in one JVM) for development and
tests, run from jars that Maven fetches from Maven Central (docs/reference/bus.md#a-local-kafka).

>>> broker = LocalBroker(Path("~/.cache/astraflow/broker"))
>>> broker.start()                     # fetches the jars once, formats storage once
>>> connect(f"kafka://{broker.bootstrap}")
>>> broker.stop()

The data directory holds everything: ``server.properties``, ``log4j2.properties``, the Kafka log
dirs (``kraft/``), the broker's own log (``broker.log``, JVM output in ``jvm.log``) and a state
file (``broker.json``: pid and ports) through which another process attaches to a running broker
(:meth:`LocalBroker.attach`). Data and ports survive restarts.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from astraflow.core.broker.jars import (
    Progress,
    fetch_jars,
    kafka_version,
    require_java,
    tail_text,
)
from astraflow.core.broker.probe import Probe, tail_file
from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_port
from astraflow.core.secrets import write_private

log = logging.getLogger("astraflow.broker")

_STATE = "broker.json"
_LISTENER_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_RESERVED = ("PLAINTEXT", "CONTROLLER", "SASL", "SSL")


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path
    log_file: Path


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_id() -> str:
    """A Kafka cluster id, as ``StorageTool random-uuid`` makes them (without a JVM start)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


#: The JVM's options besides the heap: a one-node development broker is mostly idle, so the
#: client compiler alone (no C2) and the serial collector (no concurrent GC threads). Measured
#: on 2 cores against the JVM's defaults (python -m bench.broker_cpu): 3.5 CPU-s to start
#: instead of 7.0, 1.8 CPU-s a minute idle instead of 2.8.
#: A broker that must take a heavy sustained load: ``jvm_flags=()`` (`--jvm-flags ""`).
DEV_JVM_FLAGS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class LocalBroker:
    """A single-node KRaft Kafka broker in its own JVM, with its data in ``data_dir``.

    Ports not given are taken from the data dir's state file (so a restart or another process
    uses the same ones), else chosen free. The JVM runs detached in its own session and
    outlives this object until :meth:`stop`.

    ``extra_listeners`` (``{NAME: (bind_port, "host:port")}``) adds plaintext listeners that
    bind ``127.0.0.1:bind_port`` and advertise ``host:port``: a client that bootstraps through
    a TCP proxy (docs/wan.md) must be told the proxy's address, not the broker's, or its
    connections after the first bypass the proxy. Kept in the state file like the ports.

    ``sasl_port`` with ``sasl_users`` (``{username: password}``) adds a ``SASL`` listener on
    ``127.0.0.1:sasl_port`` that takes SASL_PLAINTEXT with the PLAIN mechanism and only those
    users: clients set ``security.protocol=SASL_PLAINTEXT``, ``sasl.mechanism=PLAIN``,
    ``sasl.username`` and ``sasl.password`` (a development broker: the passwords are kept in
    its state file and properties in the clear).

    ``ssl_port`` with ``ssl_keystore`` (a PKCS12 keystore holding the broker's key and
    certificate, e.g. made by Java's ``keytool -genkeypair -storetype PKCS12``) and
    ``ssl_password`` (the keystore's and the key's password) adds an ``SSL`` listener on
    ``127.0.0.1:ssl_port`` (TLS, no client certificate asked): clients set
    ``security.protocol=SSL`` and ``ssl.ca.location`` (a PEM file of the certificate that
    signed the broker's; its name must cover 127.0.0.1, as librdkafka checks it).

    ``jvm_flags``: the JVM's options besides the heap (:data:`DEV_JVM_FLAGS` unless given;
    kept in the state file like the ports).
    """

    def __init__(self, data_dir: Path | str, *, port: int | None = None,
                 controller_port: int | None = None, heap: str = "512m",
                 extra_listeners: Mapping[str, tuple[int, str]] | None = None,
                 sasl_port: int | None = None,
                 sasl_users: Mapping[str, str] | None = None,
                 ssl_port: int | None = None, ssl_keystore: Path | str | None = None,
                 ssl_password: str | None = None,
                 jvm_flags: Sequence[str] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        state = self._read_state()
        flags = jvm_flags if jvm_flags is not None else state.get("jvm_flags", DEV_JVM_FLAGS)
        self.jvm_flags = tuple(str(f) for f in flags)
        bad_flags = [f for f in self.jvm_flags if not f.startswith("-") or f.startswith("-Xm")]
        if bad_flags:
            raise BrokerError(f"bad JVM flags {bad_flags}: each starts with '-' (e.g. "
                              "-XX:+UseG1GC); the heap is set by heap=, not -Xmx/-Xms")
        self.port = int(port or state.get("port") or free_port())
        self.controller_port = int(controller_port or state.get("controller_port")
                                   or free_port(exclude=self.port))
        if self.port == self.controller_port:
            raise BrokerError(f"port {self.port} given for both the broker and the controller")
        self.heap = heap
        listeners = (extra_listeners if extra_listeners is not None
                     else state.get("extra_listeners", {}))
        self.extra_listeners = {str(k): (int(p), str(a)) for k, (p, a) in listeners.items()}
        users = sasl_users if sasl_users is not None else state.get("sasl_users", {})
        self.sasl_users = {str(u): str(p) for u, p in users.items()}
        port_ = sasl_port if sasl_port is not None else state.get("sasl_port")
        self.sasl_port = int(port_) if port_ else None
        if (self.sasl_port is None) != (not self.sasl_users):
            raise BrokerError("a SASL listener needs both sasl_port and sasl_users "
                              "({username: password}, at least one)")
        bad = [u for u in [*self.sasl_users, *self.sasl_users.values()]
               if not u or '"' in u or "\\" in u or ";" in u]
        if bad:
            raise BrokerError("SASL user names and passwords must be non-empty and hold no "
                              "quote, backslash or semicolon")
        ssl_ = ssl_port if ssl_port is not None else state.get("ssl_port")
        self.ssl_port = int(ssl_) if ssl_ else None
        store = ssl_keystore if ssl_keystore is not None else state.get("ssl_keystore")
        self.ssl_keystore = Path(store).expanduser().resolve() if store else None
        self.ssl_password = str(ssl_password if ssl_password is not None
                                else state.get("ssl_password") or "")
        if (self.ssl_port is None) != (self.ssl_keystore is None) or (
                self.ssl_port is not None and not self.ssl_password):
            raise BrokerError("an SSL listener needs ssl_port, ssl_keystore (a PKCS12 keystore: "
                              "keytool -genkeypair -storetype PKCS12) and ssl_password")
        self._check_extra_listeners()
        self._proc: subprocess.Popen[bytes] | None = None

    def _check_extra_listeners(self) -> None:
        taken = {self.port: "the broker", self.controller_port: "the controller"}
        for name, (port, advertised) in self.extra_listeners.items():
            if not _LISTENER_NAME.fullmatch(name) or name in _RESERVED:
                raise BrokerError(f"bad extra listener name {name!r}; use upper-case letters, "
                                  f"digits and _ (e.g. REGION_B), other than "
                                  f"{', '.join(_RESERVED)}")
            host, sep, adv_port = advertised.rpartition(":")
            if not sep or not host or not adv_port.isdigit():
                raise BrokerError(f"extra listener {name}: advertised address {advertised!r} "
                                  "is not host:port")
            if port in taken:
                raise BrokerError(f"extra listener {name}: port {port} is already used by "
                                  f"{taken[port]}")
            taken[port] = f"listener {name}"
        for name, p in (("SASL", self.sasl_port), ("SSL", self.ssl_port)):
            if p is not None and p in taken:
                raise BrokerError(f"{name} listener: port {p} is already used by {taken[p]}")
            if p is not None:
                taken[p] = f"the {name} listener"

    @classmethod
    def attach(cls, data_dir: Path | str) -> LocalBroker:
        """The broker whose state file is in ``data_dir`` (started by any process)."""
        path = Path(data_dir).expanduser().resolve()
        state_file = path / _STATE
        if not state_file.is_file():
            raise BrokerError(f"no local broker in {path} (no {_STATE}); "
                              f"start one with: astraflow broker start --dir {path}")
        state = json.loads(state_file.read_text())
        return cls(path, heap=state.get("heap", "512m"))

    # ---- paths and config

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def jvm_log_file(self) -> Path:
        return self.data_dir / "jvm.log"

    @property
    def kafka_dir(self) -> Path:
        return self.data_dir / "kraft"

    def server_properties(self) -> dict[str, str]:
        """The broker's configuration (written to ``server.properties``)."""
        host = "127.0.0.1"
        extra = self.extra_listeners.items()
        security: dict[str, str] = {}
        secured: list[str] = []
        if self.sasl_port is not None:
            secured = [f"SASL://{host}:{self.sasl_port}"]
            users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            security = {"sasl.enabled.mechanisms": "PLAIN",
                        "listener.name.sasl.plain.sasl.jaas.config":
                            f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                            f"{users};"}
        if self.ssl_port is not None:
            secured.append(f"SSL://{host}:{self.ssl_port}")
            security.update({"listener.name.ssl.ssl.keystore.type": "PKCS12",
                             "listener.name.ssl.ssl.keystore.location": str(self.ssl_keystore),
                             "listener.name.ssl.ssl.keystore.password": self.ssl_password,
                             "listener.name.ssl.ssl.key.password": self.ssl_password,
                             "listener.name.ssl.ssl.client.auth": "none"})
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{host}:{self.controller_port}",
            "listeners": ",".join([f"PLAINTEXT://{host}:{self.port}",
                                   f"CONTROLLER://{host}:{self.controller_port}",
                                   *(f"{n}://{host}:{p}" for n, (p, _) in extra),
                                   *secured]),
            "advertised.listeners": ",".join([f"PLAINTEXT://{host}:{self.port}",
                                              *(f"{n}://{a}" for n, (_, a) in extra),
                                              *secured]),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(
                ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT",
                 *(f"{n}:PLAINTEXT" for n in self.extra_listeners),
                 *(["SASL:SASL_PLAINTEXT"] if self.sasl_port is not None else []),
                 *(["SSL:SSL"] if self.ssl_port is not None else [])]),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.kafka_dir),
            "num.partitions": "1",
            # One node: the internal topics cannot have 3 replicas (the default), and without
            # them idempotent producers, groups and transactions do not work.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",  # tests use short sessions
            "auto.create.topics.enable": "false",  # topics come from the topic table only
        }
        return {**props, **security}

    def write_config(self) -> None:
        """Write ``server.properties`` and ``log4j2.properties`` into the data dir."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}" for k, v in self.server_properties().items()]
        header = "# Written by astraflow (LocalBroker); rewritten at every start.\n"
        write_private(self.config_file, header + "\n".join(lines) + "\n")  # SASL's JAAS
        template = resources.files("astraflow.core.broker").joinpath("log4j2.properties")
        text = template.read_text().replace("@LOG_FILE@", str(self.log_file))
        (self.data_dir / "log4j2.properties").write_text(text)

    # ---- state file

    def _read_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads((self.data_dir / _STATE).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise BrokerError(f"unreadable broker state file {self.data_dir / _STATE}: {e}; "
                              "delete it if no broker runs from this directory") from e
        return state

    def _write_state(self, pid: int | None) -> None:
        state = {"pid": pid, "port": self.port, "controller_port": self.controller_port,
                 "bootstrap": self.bootstrap, "heap": self.heap,
                 "extra_listeners": self.extra_listeners,
                 "sasl_port": self.sasl_port, "sasl_users": self.sasl_users,
                 "ssl_port": self.ssl_port,
                 "ssl_keystore": str(self.ssl_keystore) if self.ssl_keystore else None,
                 "ssl_password": self.ssl_password or None,
                 "jvm_flags": list(self.jvm_flags),
                 "kafka_version": kafka_version(), "updated_at": time.time()}
        write_private(self.data_dir / _STATE, json.dumps(state, indent=2) + "\n")  # passwords

    def _pid_alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None  # also reaps our own child
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        proc = Path(f"/proc/{pid}")
        if not proc.exists():  # no procfs (macOS): trust kill(0)
            return True
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        if stat.rpartition(")")[2].split()[0] == "Z":
            return False
        # Guards against a reused pid: it must be the broker of this data dir.
        return "kafka.Kafka" in cmdline and str(self.config_file) in cmdline

    def pid(self) -> int | None:
        """The pid of this data dir's running broker, or None."""
        pid = self._read_state().get("pid")
        return int(pid) if pid and self._pid_alive(int(pid)) else None

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(running=pid is not None, pid=pid, bootstrap=self.bootstrap,
                            data_dir=self.data_dir, log_file=self.log_file)

    # ---- lifecycle

    def _format(self, java: str, libs: Path) -> None:
        if (self.kafka_dir / "meta.properties").is_file():
            return  # formatted before: keep the data
        cmd = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
               "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
               "-c", str(self.config_file), "--ignore-formatted"]
        proc = subprocess.run(cmd, cwd=self.data_dir, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BrokerError(f"formatting the Kafka storage in {self.kafka_dir} failed "
                              f"(exit {proc.returncode}):\n{tail_text(proc.stdout + proc.stderr, 20)}")

    def _heap_flags(self) -> list[str]:
        m = re.fullmatch(r"(\d+)([kKmMgG]?)", self.heap)
        if m is None:
            raise BrokerError(f"bad heap size {self.heap!r}; use e.g. 512m or 2g")
        mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
        xms = "256m" if int(m.group(1)) * mult >= 256 << 20 else self.heap
        return [f"-Xms{xms}", f"-Xmx{self.heap}"]

    def start(self, timeout: float = 60.0, progress: Progress | None = None) -> None:
        """Start the broker (fetching jars and formatting storage on first use) and return once
        it answers clients. A no-op when it already runs."""
        if self.pid() is not None:
            return
        deadline = time.monotonic() + timeout
        libs = fetch_jars(progress)
        java = require_java()
        for port in (self.port, self.controller_port,
                     *(p for p, _ in self.extra_listeners.values()),
                     *(p for p in (self.sasl_port, self.ssl_port) if p is not None)):
            if not _port_free(port):
                raise BrokerError(f"port {port} on 127.0.0.1 is in use; stop what listens there "
                                  "or choose other ports (--port)")
        self.write_config()
        self._format(java, libs)
        cmd = [java, *self._heap_flags(), *self.jvm_flags, "-XX:+ExitOnOutOfMemoryError",
               "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
               "-cp", f"{libs}/*", "kafka.Kafka", str(self.config_file)]
        if progress:
            progress(f"Starting Kafka {kafka_version()} on {self.bootstrap}")
        with open(self.jvm_log_file, "wb") as out:
            self._proc = subprocess.Popen(cmd, cwd=self.data_dir, stdin=subprocess.DEVNULL,
                                          stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self._write_state(self._proc.pid)
        log.info("broker starting pid=%d bootstrap=%s dir=%s", self._proc.pid, self.bootstrap,
                 self.data_dir)
        try:
            self._wait_ready(deadline)
        except BrokerError:
            self.stop(timeout=10)
            raise

    def _failure_context(self) -> str:
        parts = [f"--- {p.name} (last lines) ---\n{t}" for p in (self.jvm_log_file, self.log_file)
                 if (t := tail_file(p))]
        return "\n".join(parts) or f"(no output in {self.jvm_log_file})"

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        probe = Probe(self.bootstrap, self.log_file)
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise BrokerError(f"the Kafka broker exited with code {code} while starting "
                                      f"(data dir {self.data_dir}):\n{self._failure_context()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerError(f"the Kafka broker did not answer on {self.bootstrap} "
                                      f"within the start timeout:\n{self._failure_context()}")
                if probe.ready(min(1.0, max(left, 0.1))):
                    log.info("broker ready bootstrap=%s pid=%d", self.bootstrap, self._proc.pid)
                    return
        finally:
            probe.close()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``timeout``; waits for the exit."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                log.warning("broker pid=%d did not stop in %.0fs; killing it", pid, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if not self._wait_exit(pid, 10):
                    raise BrokerError(f"broker pid {pid} survived SIGKILL")
        if (self.data_dir / _STATE).is_file():
            self._write_state(None)
        self._proc = None

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self._pid_alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start again, keeping the data and the ports."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


EXTERNAL_ENV = "ASTRAFLOW_KAFKA_BOOTSTRAP"


@contextlib.contextmanager
def kafka_bootstrap(workdir: Path, *, log: Callable[[str], None] | None = None
                    ) -> Iterator[str]:
    """``host:port`` of a Kafka cluster for a benchmark or a script: the external one named by
    ``ASTRAFLOW_KAFKA_BOOTSTRAP``, else a local broker started in ``workdir`` for the block
    and stopped after it."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        yield external
        return
    if log is not None:
        log("starting a local Kafka broker ...")
    broker = LocalBroker(Path(workdir) / "kafka")
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
