"""Session fixtures shared by every test package.

Kafka: tests marked ``kafka`` get a real broker. With ``ASTRAFLOW_KAFKA_BOOTSTRAP=host:port``
they use that external cluster; otherwise the session starts a local single-node broker
(``LocalBroker``) in a temporary directory, on free ports, the first time a test asks for one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from astraflow.core.broker import LocalBroker
from astraflow.core.errors import BrokerError

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
def local_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """The session's local broker (a ``LocalBroker``), for tests that stop or restart it.

    Skipped when an external cluster is configured: such tests cannot restart it.
    """
    if os.environ.get(EXTERNAL_KAFKA_ENV):
        pytest.skip(f"{EXTERNAL_KAFKA_ENV} is set: the tests use that external Kafka cluster, "
                    "and this test needs the local broker it can stop and restart")
    broker = LocalBroker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        broker.start(timeout=90)
    except BrokerError as e:  # an error, not a skip: the kafka tests were asked for
        pytest.fail(f"could not start the local Kafka broker: {e}", pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """``host:port`` of the Kafka cluster the tests use: external if configured, else local."""
    external = os.environ.get(EXTERNAL_KAFKA_ENV)
    if external:
        return external
    broker = request.getfixturevalue("local_kafka_broker")
    return str(broker.bootstrap)
