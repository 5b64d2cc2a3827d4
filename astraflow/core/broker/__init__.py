"""The local Apache Kafka broker for development and tests (``astraflow broker ...``)."""

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
