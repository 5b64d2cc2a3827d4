"""The bus: ``connect(url)`` gives a :class:`Bus` for the embedded or the Kafka backend.

>>> bus = connect("embedded:///tmp/run/bus.db")          # the default: a SQLite file
>>> bus = connect("kafka://127.0.0.1:9092", config={"security.protocol": "SASL_SSL", ...})

Everything a component needs is on the returned object: ``create_topics``, ``producer()``,
``consumer(group, topics)``, ``committed``/``lag``. See :mod:`astraflow.core.bus.types` for the
contract both backends meet.

Modules:

- :mod:`.embedded`: the embedded bus: logs and consumer groups in one SQLite file.
- :mod:`.embedded_db`: the SQLite file behind the embedded bus: schema, connections, writes.
- :mod:`.embedded_fetch`: reading records of the embedded bus: fetch buffers, fair delivery.
- :mod:`.embedded_group`: consumer groups of the embedded bus.
- :mod:`.embedded_reader`: the embedded bus's group-less reader.
- :mod:`.kafka`: the Kafka backend, through confluent-kafka (librdkafka).
- :mod:`.kafka_clients`: the Kafka bus's producer and consumer.
- :mod:`.kafka_common`: what the Kafka clients share: error classes, log routing.
- :mod:`.kafka_reader`: the Kafka bus's group-less reader.
- :mod:`.partitioner`: key → partition, the same on every backend (Kafka's murmur2).
- :mod:`.reader`: the backend-neutral half of the group-less reader.
- :mod:`.types`: the bus protocol every component uses (docs/reference/bus.md).
- :mod:`.url`: bus URLs: ``embedded:///abs/path/bus.db``, ``kafka://host:port[?...]``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from astraflow.core.bus.types import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Bus,
    Consumer,
    Headers,
    Message,
    Producer,
    TopicInfo,
)
from astraflow.core.bus.url import BusURL, embedded_url, parse_url, url_path

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES", "Bus", "BusURL", "Consumer", "Headers", "Message", "Producer",
    "TopicInfo", "connect", "embedded_url", "open_bus", "parse_url", "url_path",
]


def connect(url: str, *, config: Mapping[str, str] | None = None,
            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Bus:
    """Open the bus at ``url``.

    ``config`` holds extra backend settings: for Kafka, any librdkafka client property
    (``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``, ...),
    applied to producers, consumers and the admin client; settings in the URL's query string
    are merged under it. For the embedded bus, ``synchronous`` (``normal`` | ``full``).
    ``max_message_bytes`` is the largest record accepted (Kafka's default, 1 MB).
    """
    parsed = parse_url(url)
    options = {**parsed.options, **dict(config or {})}
    if parsed.scheme == "embedded":
        from astraflow.core.bus.embedded import EmbeddedBus

        assert parsed.path is not None
        return EmbeddedBus(parsed.path, options=options, max_message_bytes=max_message_bytes)
    from astraflow.core.bus.kafka import KafkaBus

    return KafkaBus(parsed.bootstrap, options=options, max_message_bytes=max_message_bytes)


def open_bus(url: str, out: str | Path = ".", *, options: Mapping[str, str] | None = None,
             topics: Mapping[str, int] | None = None) -> Bus:
    """Open the bus of a run: ``url`` with ``{out}`` (the run directory) expanded, ``options``
    as for :func:`connect`, then ``topics`` (name -> partitions, e.g. from
    :func:`astraflow.core.topics.run_topics`) created, idempotently, so that any role may
    start first."""
    from astraflow.core.paths import expand

    # the run directory goes into a URL: '#', '?' or '%' in its name must not end the path
    bus = connect(expand(url, out=url_path(Path(out).resolve())), config=options)
    if topics:
        try:
            bus.create_topics(dict(topics))
        except BaseException:
            bus.close()
            raise
    return bus
