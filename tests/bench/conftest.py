"""Fixtures of the emulated-WAN tests: a Toxiproxy server, and the session's Kafka broker
reached through a proxy with a 300 ms round trip."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from astraflow.core.broker import LocalBroker
from bench.lib.wan import INSTALL_HINT, Link, Toxiproxy, find_toxiproxy

RTT_S = 0.3


@pytest.fixture(scope="module")
def toxiproxy() -> Iterator[Toxiproxy]:
    """A toxiproxy-server child for the module; skipped (with the install command) without
    the binary."""
    if find_toxiproxy() is None:
        pytest.skip(INSTALL_HINT)
    with Toxiproxy() as tp:
        yield tp


@pytest.fixture(scope="module")
def wan_kafka(toxiproxy: Toxiproxy, local_kafka_broker: LocalBroker
              ) -> Iterator[tuple[LocalBroker, str]]:
    """The session's broker, whose WAN listener advertises the address of a proxy put in front
    of it here (a 300 ms round trip): clients that bootstrap through the proxy stay behind
    it."""
    bind_port, advertised = local_kafka_broker.extra_listeners["WAN"]
    proxy = toxiproxy.proxy("kafka-wan", upstream=f"127.0.0.1:{bind_port}", listen=advertised,
                            link=Link(rtt_ms=RTT_S * 1000))
    yield local_kafka_broker, proxy.listen
    proxy.delete()
