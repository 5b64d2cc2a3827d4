"""The local Apache Kafka broker for development and tests (``astraflow broker ...``).

Modules:

- :mod:`.jars`: the local broker's jars, fetched from Maven Central with ``mvn`` once.
- :mod:`.local`: a local single-node Apache Kafka (KRaft, one JVM).
- :mod:`.probe`: whether a starting local broker serves clients yet."""

from astraflow.core.broker.jars import (
    cache_dir,
    fetch_jars,
    jars_dir,
    kafka_version,
    require_java,
)
from astraflow.core.broker.local import BrokerStatus, LocalBroker, kafka_bootstrap

__all__ = ["BrokerStatus", "LocalBroker", "cache_dir", "fetch_jars", "jars_dir",
           "kafka_bootstrap", "kafka_version", "require_java"]
