"""The local Apache Kafka broker for development and tests (``astraflow broker ...``).

Modules:

- :mod:`.jars`: The local broker's jars: fetched from Maven Central with ``mvn`` once, into a
  cache.
- :mod:`.local`: A local single-node Apache Kafka (KRaft, broker + controller in one JVM) for
  development and tests.
- :mod:`.probe`: Whether a starting local broker serves clients yet (:meth:`LocalBroker.start`
  polls it).
"""

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
