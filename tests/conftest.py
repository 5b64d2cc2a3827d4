"""Session fixtures shared by every test package.

Kafka: tests marked ``kafka`` get a real broker. With ``ASTRAFLOW_KAFKA_BOOTSTRAP=host:port``
they use that external cluster; otherwise the session starts a local single-node broker
(``LocalBroker``) in a temporary directory, on free ports, the first time a test asks for one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hangwatch import pytest_runtest_protocol  # noqa: F401  (the CI's hard per-test limit)

from astraflow.core.broker import LocalBroker, require_java
from astraflow.core.errors import BrokerError
from astraflow.core.ports import free_ports

EXTERNAL_KAFKA_ENV = "ASTRAFLOW_KAFKA_BOOTSTRAP"
BACKENDS = ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)]


@pytest.fixture(params=BACKENDS)
def bus_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bus URL of each backend (the parametrized fixture of the backend-invariant tests);
    the Kafka one points at the session's real broker."""
    if request.param == "embedded":
        return f"embedded://{tmp_path_factory.mktemp('bus')}/bus.db"
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    return f"kafka://{bootstrap}"


@pytest.fixture(scope="session")
def ascii_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model over printable ASCII (chat text, tool calls, JSON), 256 positions
    (the rollout and gateway tests')."""
    from astraflow.models.tiny import build_model, build_tokenizer, save

    tok = build_tokenizer("ascii")
    root = tmp_path_factory.mktemp("models")
    return save(build_model(tok, seed=0, max_positions=256), tok, root / "tiny-ascii")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where scripts/test.sh runs the slow tests in two processes (pytest-xdist, ``--dist
    loadgroup``): the Kafka tests go to one process, so that one broker serves them all. A
    module with a group of its own keeps it. (A broker in each process instead, the Kafka
    tests spread over both, took 806 s here against 737 s: one run each.) The tests that start
    from the quickstart's warm-up go to either: the processes share one warm-up
    (tests/e2e/conftest.py)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (
                item.get_closest_marker("kafka") is not None):
            item.add_marker(pytest.mark.xdist_group("kafka"))


def pytest_configure(config: pytest.Config) -> None:
    """``--dist loadgroup`` (scripts/test.sh) with a pytest whose node ids pytest-xdist can no
    longer suffix with the group (pytest >= 9.2, pytest-xdist <= 3.8:
    pytest-dev/pytest-xdist#1386) would quietly run a broker and a warm-up in each process:
    refused instead (pyproject.toml pins pytest below 9.2)."""
    if getattr(config.option, "dist", None) != "loadgroup":
        return
    from importlib.metadata import version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(x) for x in version(name).split(".")[:2] if x.isdigit())

    if release("pytest") >= (9, 2) and release("pytest-xdist") < (3, 9):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} does not "
            "group tests under --dist loadgroup (pytest-dev/pytest-xdist#1386): install the "
            "versions pyproject.toml pins (pip install -e '.[dev]')")


SASL_USERS = {"alice": "alice-secret"}
SSL_PASSWORD = "keystore-secret"


def make_keystore(directory: Path) -> tuple[Path, Path]:
    """(a PKCS12 keystore, its certificate in PEM) made by Java's keytool: an RSA key and a
    self-signed certificate whose name is 127.0.0.1 (librdkafka checks the broker's address
    against it), the keystore and key under SSL_PASSWORD. The PEM is what a client trusts
    (``ssl.ca.location``)."""
    keytool = str(Path(require_java()).resolve().parent / "keytool")
    store, pem = directory / "broker.p12", directory / "broker-ca.pem"
    common = ["-alias", "broker", "-keystore", str(store), "-storetype", "PKCS12",
              "-storepass", SSL_PASSWORD]
    for args in (["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "7",
                  "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1",
                  "-keypass", SSL_PASSWORD],
                 ["-exportcert", "-rfc", "-file", str(pem)]):
        proc = subprocess.run([keytool, *args, *common], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode != 0:
            pytest.fail(f"keytool {args[0]} failed: {proc.stdout}{proc.stderr}", pytrace=False)
    return store, pem


@pytest.fixture(scope="session")
def local_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """The session's local broker (a ``LocalBroker``), for tests that stop or restart it.

    Skipped when an external cluster is configured: such tests cannot restart it.
    """
    if os.environ.get(EXTERNAL_KAFKA_ENV):
        pytest.skip(f"{EXTERNAL_KAFKA_ENV} is set: the tests use that external Kafka cluster, "
                    "and this test needs the local broker it can stop and restart")
    # a second listener, WAN, advertised at a port where the emulated-WAN tests put a
    # Toxiproxy proxy in front of it (tests/bench): clients that bootstrap there stay behind the
    # proxy; nothing listens on the advertised port otherwise, and nothing else uses it
    # and a SASL_PLAINTEXT listener (PLAIN, the users of SASL_USERS) for the tests that
    # check that security settings reach the Kafka clients, and an SSL listener (a keystore
    # made by keytool here) for the TLS test
    wan_bind, wan_proxy, sasl_port, ssl_port = free_ports(4)
    store, _ = make_keystore(tmp_path_factory.mktemp("kafka-tls"))
    broker = LocalBroker(tmp_path_factory.mktemp("kafka-broker"),
                         extra_listeners={"WAN": (wan_bind, f"127.0.0.1:{wan_proxy}")},
                         sasl_port=sasl_port, sasl_users=SASL_USERS,
                         ssl_port=ssl_port, ssl_keystore=store, ssl_password=SSL_PASSWORD)
    try:
        broker.start(timeout=90)
    except BrokerError as e:  # an error, not a skip: the kafka tests were asked for
        pytest.fail(f"could not start the local Kafka broker: {e}", pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_sasl(local_kafka_broker: LocalBroker) -> dict[str, str]:
    """The session broker's SASL_PLAINTEXT listener: ``bootstrap`` and the librdkafka
    settings of a user it accepts."""
    user, password = next(iter(SASL_USERS.items()))
    return {"bootstrap": f"127.0.0.1:{local_kafka_broker.sasl_port}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": password}


@pytest.fixture(scope="session")
def kafka_ssl(local_kafka_broker: LocalBroker) -> dict[str, str]:
    """The session broker's SSL listener: ``bootstrap`` and the librdkafka settings that
    trust its certificate."""
    assert local_kafka_broker.ssl_keystore is not None
    pem = local_kafka_broker.ssl_keystore.parent / "broker-ca.pem"
    return {"bootstrap": f"127.0.0.1:{local_kafka_broker.ssl_port}",
            "security.protocol": "SSL", "ssl.ca.location": str(pem)}


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """``host:port`` of the Kafka cluster the tests use: external if configured, else local."""
    external = os.environ.get(EXTERNAL_KAFKA_ENV)
    if external:
        return external
    broker = request.getfixturevalue("local_kafka_broker")
    return str(broker.bootstrap)


class RuleEngine:
    """An engine that answers each request by a rule of its prompt's text (so an episode's
    outcome is known in advance): ``rule(prompt_text) -> completion``. Like a real engine, it
    ends a completion with ``<eos>`` unless one of the request's stop strings ends it (a tool
    call), and cuts it at ``max_new_tokens`` (finish reason ``length``, as an engine reports).
    Records its requests (``calls``) and how many batches it was given (``batches``)."""

    name = "rule"
    continuous = False
    max_batch_size = 1024

    def __init__(self, tokenizer: Any, rule: Callable[[str], str], *, version: int = 0) -> None:
        self.tokenizer, self.rule, self._version = tokenizer, rule, version
        self.calls: list[Any] = []
        self.batches = 0

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        from astraflow.consumers.rollout.engines.base import GenResult

        self.batches += 1
        out = []
        for r in requests:
            self.calls.append(r)
            text = self.rule(self.tokenizer.decode(list(r.prompt_ids), skip_special_tokens=True))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not any(s in text for s in r.stop):
                ids.append(self.tokenizer.eos_token_id)
            finish = "length" if len(ids) > r.max_new_tokens else "stop"
            ids = ids[:r.max_new_tokens]
            out.append(GenResult(ids, [-0.1] * len(ids), [self._version] * len(ids), finish))
        return out

    def weight_target(self) -> None:
        return None

    def update_weights(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def close(self) -> None:
        pass


@pytest.fixture
def sys_path_restored() -> Iterator[None]:
    """sys.path and $PYTHONPATH as they were before the test: a command run in the test
    process (`find_user_code`, as for a user) adds the working directory and the config's
    directory to both, which must not reach the next tests."""
    path, env = list(sys.path), os.environ.get("PYTHONPATH")
    yield
    sys.path[:] = path
    if env is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = env


@pytest.fixture
def rule_engine() -> type[RuleEngine]:
    """:class:`RuleEngine`, to build one per policy: ``rule_engine(tokenizer, rule)``."""
    return RuleEngine


@pytest.fixture
def new_run() -> Callable[[Path, Path], None]:
    """``new_run(config, out)``: the run's embedded bus and topics in ``out``, as `astraflow
    run` makes them before its roles start (a role joins a run; it refuses a directory with
    no bus)."""
    def make(config: Path, out: Path) -> None:
        from astraflow.config import load_experiment
        from astraflow.run.resources import create_run_topics, open_bus

        cfg = load_experiment(config)
        bus = open_bus(cfg, out)
        try:
            create_run_topics(cfg, bus)
        finally:
            bus.close()
    return make
