"""What the Kafka bus's clients share (confluent-kafka): the error classes they retry or
give up on, librdkafka's log routing (:class:`ClientLog`), watermarks and polling.

Imported only through :mod:`astraflow.core.bus.kafka`, itself imported lazily by ``connect()``,
so confluent-kafka is needed only by those who use the Kafka bus.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from astraflow.core.bus.types import Message
from astraflow.core.errors import BusError

try:
    import confluent_kafka as ck
    from confluent_kafka import admin as ck_admin  # noqa: F401  (the bus's and producer's)
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise BusError("the kafka bus needs confluent-kafka: pip install 'astraflow[kafka]'") from _e

log = logging.getLogger("astraflow.bus.kafka")

TIMEOUT = 30.0  # metadata and offset requests
COMMIT_RETRY_S = 30.0  # how long a commit is retried while the coordinator is unreachable
#: ... and inside a revocation callback, where waiting out a rebalance cannot succeed: the
#: round the broker is in ends only once this member returns from the callback and rejoins,
#: so a long retry there would hold every other member's assignment back with it
REVOKE_COMMIT_RETRY_S = 2.0
NOISE_EVERY_S = 5.0
#: Protocol overhead allowed on top of max_message_bytes in librdkafka's and the topic's
#: limits, so that our own exact, up-front size check is the one that fires.
OVERHEAD = 64 * 1024

E = ck.KafkaError
# The member is still in the group, which is rebalancing: it still owns what it has not yet
# been told to revoke (cooperative protocol), so the commit is retried once the round ends.
_REBALANCING = {E.REBALANCE_IN_PROGRESS, E.STALE_MEMBER_EPOCH}
# The membership itself is gone (session expired, fenced): every partition went with it.
_MEMBERSHIP_LOST = {E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID,
                    E._ASSIGNMENT_LOST, E.FENCED_MEMBER_EPOCH}
_REBALANCE = _REBALANCING | _MEMBERSHIP_LOST
_RETRY = {E._TRANSPORT, E._TIMED_OUT, E._WAIT_COORD, E.COORDINATOR_NOT_AVAILABLE,
          E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT,
          E._ALL_BROKERS_DOWN, E.NETWORK_EXCEPTION}
_TRANSIENT = _RETRY | {E._MAX_POLL_EXCEEDED, E._PARTITION_EOF, E._RESOLVE,
                       E.NOT_LEADER_FOR_PARTITION, E.LEADER_NOT_AVAILABLE}
_UNKNOWN_TOPIC = {E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_TOPIC, E._UNKNOWN_PARTITION}
#: librdkafka warnings about states it recovers from by itself: logged at INFO.
_BENIGN = (": retrying", "not found in cache", "Coordinator load in progress")
_NOISE = ("Connection refused", "Connect to", "brokers are down", "Disconnected",
          "Connection reset", "connection close", "Receive failed", "Send failed",
          "Failed to resolve", "timed out")


def too_large_message(topic: str, size: int, limit: int | str, where: str) -> str:
    lim = f"{limit:,}" if isinstance(limit, int) else limit
    return (f"record of {size:,} bytes for topic {topic!r} is over {where} of {lim} bytes. "
            "Large payloads such as weights go through the weight store with only a manifest "
            "on the bus; or raise max_message_bytes in connect() AND the broker's "
            "message.max.bytes / the topic's max.message.bytes.")


def to_message(msg: Any) -> Message:
    """A :class:`Message` from a confluent-kafka message without an error."""
    _kind, ts = msg.timestamp()
    return Message(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                   key=msg.key(), value=msg.value() or b"",
                   headers=[(k, v or b"") for k, v in msg.headers() or ()],
                   timestamp=ts / 1000.0 if ts > 0 else 0.0)


def watermarks(client: Any, topic: str, partition: int) -> tuple[int, int]:
    """(low, high) offsets of ``topic[partition]``, retried while the cluster settles: just
    after a topic is created (or a broker restarted) its leader may answer
    NOT_LEADER_FOR_PARTITION for a moment. Raises ck.KafkaException after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    delay = 0.05
    while True:
        try:
            lo, hi = client.get_watermark_offsets(ck.TopicPartition(topic, partition),
                                                  timeout=TIMEOUT, cached=False)
            return int(lo), int(hi)
        except ck.KafkaException as e:
            err = kafka_error(e)
            if not (err.code() in _TRANSIENT or err.retriable()) or \
                    time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(1.0, delay * 2)


def kafka_error(e: BaseException) -> ck.KafkaError:
    err = e.args[0] if e.args else None
    return err if isinstance(err, ck.KafkaError) else ck.KafkaError(E._FAIL, str(e))


class ClientLog:
    """librdkafka's ``logger`` and ``error_cb`` for one client: forwards to Python logging and
    turns the stream of connection failures while a broker is down into one WARNING every
    few seconds (the rest at DEBUG)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._last_noise = -NOISE_EVERY_S
        self._suppressed = 0
        self.fatal: ck.KafkaError | None = None
        self.auth_error: str | None = None  # the last authentication (or TLS) failure, if any

    def noise(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last_noise >= NOISE_EVERY_S:
            more = f" (+{self._suppressed} similar)" if self._suppressed else ""
            log.warning("kafka at %s unreachable: %s%s", self.bootstrap, text, more)
            self._last_noise, self._suppressed = now, 0
        else:
            self._suppressed += 1
            log.debug("%s", text)

    def log(self, level: int, fmt: str, *args: object) -> None:
        """Called by librdkafka as ``logger.log(level, "%s [%s] %s", facility, name, text)``."""
        text = fmt % args if args else fmt
        if "authentication" in text.lower() and level >= logging.WARNING:
            self.auth_error = text
        if level >= logging.WARNING and any(n in text for n in _NOISE):
            self.noise(text)
        elif level >= logging.WARNING and any(b in text for b in _BENIGN):
            log.info("%s", text)
        else:
            log.log(level, "%s", text)

    def error(self, err: ck.KafkaError) -> None:
        if err.code() in (E._AUTHENTICATION, E._SSL):  # a TLS handshake refused: no retry helps
            self.auth_error = err.str()
        if err.fatal():
            self.fatal = err
            log.error("fatal kafka client error: %s", err.str())
        elif err.code() in _RETRY or any(n in err.str() for n in _NOISE):
            self.noise(err.str())
        else:
            log.warning("kafka client error: %s", err.str())

    def check(self, what: str) -> None:
        if self.fatal is not None:
            raise BusError(f"the kafka {what} hit a fatal error and must be recreated: "
                           f"{self.fatal.str()}")


def poll_one(client: Any, message: Callable[[Any], Message | None],
             timeout: float) -> Message | None:
    """The next record of a confluent-kafka consumer within ``timeout`` seconds; what
    ``message`` turns into None (an error it handled) is skipped."""
    deadline = time.monotonic() + timeout
    while True:
        msg = client.poll(max(0.0, deadline - time.monotonic()))
        if msg is None:
            return None
        out = message(msg)
        if out is not None:
            return out
        if time.monotonic() >= deadline:
            return None


def consume_many(client: Any, message: Callable[[Any], Message | None], max_records: int,
                 timeout: float) -> list[Message]:
    """Up to ``max_records`` records: wait up to ``timeout`` for the first, then take what is
    already fetched without waiting."""
    first = poll_one(client, message, timeout)
    if first is None:
        return []
    out = [first]
    if max_records > 1:
        for msg in client.consume(max_records - 1, 0):
            m = message(msg)
            if m is not None:
                out.append(m)
    return out
