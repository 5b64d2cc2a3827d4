"""The Kafka backend of the bus, through confluent-kafka (librdkafka). docs/reference/bus.md.

Producers are idempotent, compress with zstd and partition keys with murmur2 like the embedded
bus. Consumers use cooperative-sticky assignment and commit only when asked, synchronously.
Readers (:mod:`astraflow.core.bus.kafka_reader`) join no group. Topics are created with the
admin client. librdkafka's logs go to the ``astraflow.bus.kafka`` logger."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from astraflow.core.bus.kafka_clients import KafkaConsumer, KafkaProducer
from astraflow.core.bus.kafka_common import (
    _RETRY,
    OVERHEAD,
    TIMEOUT,
    ClientLog,
    ck,
    ck_admin,
    kafka_error,
    watermarks,
)
from astraflow.core.bus.kafka_reader import KafkaReader
from astraflow.core.bus.types import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ReaderStart,
    RebalanceCallback,
    TopicInfo,
)
from astraflow.core.errors import BusError, TopicError

log = logging.getLogger("astraflow.bus.kafka")

#: Options for AstraFlow itself (with their defaults), never passed to librdkafka.
OPTIONS = {"astraflow.replication_factor": "1"}


class KafkaBus:
    """The :class:`~astraflow.core.bus.types.Bus` on an Apache Kafka cluster."""

    def __init__(self, bootstrap: str, *, options: dict[str, str],
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.bootstrap = bootstrap
        self.url = f"kafka://{bootstrap}"
        self.max_message_bytes = max_message_bytes
        self._client_options: dict[str, Any] = {}
        ours = dict(OPTIONS)
        for k, v in options.items():
            if k.startswith("astraflow."):
                if k not in OPTIONS:
                    raise BusError(f"unknown option {k!r} for the kafka bus; valid: "
                                   f"{', '.join(sorted(OPTIONS))}")
                ours[k] = v
            else:
                self._client_options[k] = v
        try:
            self.replication_factor = int(ours["astraflow.replication_factor"])
        except ValueError:
            raise BusError(f"astraflow.replication_factor must be an integer, got "
                           f"{ours['astraflow.replication_factor']!r}") from None
        self._admin_log = ClientLog(bootstrap)
        self._admin: Any = None
        self._watermarks: Any = None

    # ---- client configuration

    def client_config(self, defaults: dict[str, Any] | None = None,
                      log_sink: ClientLog | None = None) -> dict[str, Any]:
        """librdkafka settings: ``defaults``, then the user's options over them."""
        sink = log_sink or ClientLog(self.bootstrap)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 2000,  # reconnect fast after a broker restart
            # Metadata requests for unknown topics must not create them on clusters where
            # the broker allows it (librdkafka's producer default is true).
            "allow.auto.create.topics": False,
            **(defaults or {}),
            **self._client_options,
        }
        conf["logger"] = sink
        conf["error_cb"] = sink.error
        if self.max_message_bytes + OVERHEAD > 100_000_000:
            conf.setdefault("receive.message.max.bytes", self.max_message_bytes + 2 * OVERHEAD)
        return conf

    @property
    def admin(self) -> Any:
        if self._admin is None:
            self._admin = ck_admin.AdminClient(self.client_config(log_sink=self._admin_log))
        return self._admin

    @property
    def _offsets_client(self) -> ck.Consumer:
        """A consumer that joins no group, for watermark offsets."""
        if self._watermarks is None:
            self._watermarks = ck.Consumer(self.client_config(
                {"group.id": "astraflow-watermarks", "enable.auto.commit": False}))
        return self._watermarks

    def _unreachable(self, what: str, e: BaseException) -> BusError:
        if self._admin is not None:
            self._admin.poll(0)  # serves its queued log lines: an authentication failure
        auth = self._admin_log.auth_error
        if auth is not None or kafka_error(e).code() == ck.KafkaError._AUTHENTICATION:
            return BusError(f"{what} failed on kafka at {self.bootstrap}: authentication "
                            f"failed ({auth or kafka_error(e).str()}); check "
                            "security.protocol, sasl.mechanism, sasl.username and "
                            "sasl.password, or over TLS ssl.ca.location (the broker "
                            "certificate's CA, PEM) (bus.options, or the bus URL's query "
                            "string)")
        return BusError(f"{what} failed on kafka at {self.bootstrap}: {kafka_error(e).str()}. "
                        "Is the broker running? (astraflow broker start)")

    # ---- topics

    def _metadata(self, topic: str | None = None) -> Any:
        """Cluster (or ``topic``'s) metadata, asked in slices of up to 2 s until TIMEOUT, so
        that an authentication failure is reported at once rather than after TIMEOUT."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            left = deadline - time.monotonic()
            try:
                return self.admin.list_topics(topic=topic, timeout=max(0.1, min(2.0, left)))
            except ck.KafkaException as e:
                self.admin.poll(0)
                if self._admin_log.auth_error is not None or time.monotonic() >= deadline:
                    raise self._unreachable("a metadata request", e) from e
            finally:
                self.admin.poll(0)  # serves the admin client's log lines

    def _partition_counts(self) -> dict[str, int]:
        return {name: len(t.partitions) for name, t in self._metadata().topics.items()
                if t.error is None}

    def _topic_config(self) -> dict[str, str]:
        if self.max_message_bytes > DEFAULT_MAX_MESSAGE_BYTES:
            return {"max.message.bytes": str(self.max_message_bytes + OVERHEAD)}
        return {}

    def create_topics(self, topics: dict[str, int], *, exist_ok: bool = True) -> None:
        existing = self._partition_counts()
        problems: list[str] = []
        new: list[Any] = []
        for name, n in topics.items():
            if not isinstance(n, int) or n < 1:
                problems.append(f"topic {name!r}: partitions must be a positive int, got {n!r}")
            elif name in existing:
                if existing[name] != n:
                    problems.append(f"topic {name!r} exists with {existing[name]} partitions, "
                                    f"asked for {n}")
                elif not exist_ok:
                    problems.append(f"topic {name!r} already exists (exist_ok=False)")
            else:
                new.append(ck_admin.NewTopic(name, num_partitions=n,
                                             replication_factor=self.replication_factor,
                                             config=self._topic_config()))
        if problems:
            raise TopicError("; ".join(problems))
        if not new:
            return
        futures = self.admin.create_topics(new, operation_timeout=TIMEOUT,
                                           request_timeout=TIMEOUT)
        for name, fut in futures.items():
            try:
                fut.result()
            except ck.KafkaException as e:
                err = kafka_error(e)
                if err.code() == ck.KafkaError.TOPIC_ALREADY_EXISTS and exist_ok:
                    continue  # created concurrently; the partition count is checked below
                problems.append(f"creating topic {name!r} with {topics[name]} partitions: "
                                f"{err.str()}")
        self.admin.poll(0)
        if problems:
            raise TopicError("; ".join(problems))
        self._await_metadata(topics)

    def _await_metadata(self, topics: dict[str, int]) -> None:
        """Until the broker's metadata shows every topic with its partitions and leaders, so
        producers and consumers created next see them at once."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            md = self._metadata()
            waiting = []
            for name, n in topics.items():
                t = md.topics.get(name)
                if t is None or t.error is not None or len(t.partitions) != n:
                    if t is not None and t.error is None:
                        raise TopicError(f"topic {name!r} exists with {len(t.partitions)} "
                                         f"partitions, asked for {n}")
                    waiting.append(name)
                elif any(p.leader < 0 for p in t.partitions.values()):
                    waiting.append(name)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TopicError(f"topics {waiting} not visible in the metadata of "
                                 f"{self.bootstrap} {TIMEOUT:.0f}s after creation")
            time.sleep(0.05)

    def list_topics(self) -> dict[str, int]:
        return {k: v for k, v in self._partition_counts().items() if not k.startswith("__")}

    def partitions(self, topic: str) -> int:
        t = self._metadata(topic).topics.get(topic)
        if t is None or t.error is not None:
            raise TopicError(f"topic {topic!r} does not exist on {self.bootstrap}; create it "
                             "with bus.create_topics (automatic creation is off)")
        return len(t.partitions)

    def end_offsets(self, topic: str, n: int) -> dict[int, tuple[int, int]]:
        out = {}
        for p in range(n):
            try:
                out[p] = watermarks(self._offsets_client, topic, p)
            except ck.KafkaException as e:
                raise self._unreachable(f"reading the offsets of {topic}[{p}]", e) from e
        self._offsets_client.poll(0)  # serves its log lines; it joins no group
        return out

    def describe_topic(self, name: str) -> TopicInfo:
        n = self.partitions(name)
        ends = {p: hi for p, (_lo, hi) in self.end_offsets(name, n).items()}
        return TopicInfo(name=name, partitions=n, end_offsets=ends)

    def delete_topics(self, names: Sequence[str]) -> None:
        """Delete topics; names that do not exist are ignored."""
        names = list(names)
        if not names:
            return
        futures = self.admin.delete_topics(names, operation_timeout=TIMEOUT,
                                           request_timeout=TIMEOUT)
        problems = []
        for name, fut in futures.items():
            try:
                fut.result()
            except ck.KafkaException as e:
                err = kafka_error(e)
                if err.code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    problems.append(f"deleting topic {name!r}: {err.str()}")
        self.admin.poll(0)
        if problems:
            raise TopicError("; ".join(problems))
        deadline = time.monotonic() + TIMEOUT
        while set(names) & set(self._metadata().topics):
            if time.monotonic() > deadline:
                raise TopicError(f"topics {names} still listed {TIMEOUT:.0f}s after deletion")
            time.sleep(0.05)

    # ---- clients

    def producer(self, *, client_id: str = "") -> KafkaProducer:
        return KafkaProducer(self, client_id=client_id)

    def consumer(self, group: str, topics: Sequence[str], *, client_id: str = "",
                 start: str = "earliest", session_timeout: float = 10.0,
                 on_assign: RebalanceCallback | None = None,
                 on_revoke: RebalanceCallback | None = None) -> KafkaConsumer:
        if start not in ("earliest", "latest"):
            raise BusError(f"unknown start {start!r}; valid: earliest, latest")
        existing = self._partition_counts()
        missing = [t for t in topics if t not in existing]
        if missing:
            raise TopicError(f"cannot subscribe group {group!r} to missing topic(s) "
                             f"{', '.join(missing)} on {self.bootstrap}; create them with "
                             "bus.create_topics")
        return KafkaConsumer(self, group, list(topics), client_id=client_id, start=start,
                             session_timeout=session_timeout, on_assign=on_assign,
                             on_revoke=on_revoke)

    def reader(self, topic: str, *, start: ReaderStart = "earliest",
               client_id: str = "") -> KafkaReader:
        """A group-less reader of every partition of ``topic`` (see the Bus protocol):
        ``assign()`` at explicit offsets, no group joined, nothing committed."""
        return KafkaReader(self, topic, start=start, client_id=client_id)

    # ---- group offsets

    def committed(self, group: str, topic: str) -> dict[int, int]:
        n = self.partitions(topic)
        deadline = time.monotonic() + TIMEOUT
        delay = 0.1
        while True:
            c = ck.Consumer(self.client_config({"group.id": group, "enable.auto.commit": False}))
            try:
                tps = c.committed([ck.TopicPartition(topic, p) for p in range(n)],
                                  timeout=TIMEOUT)
            except ck.KafkaException as e:
                # A new group's coordinator answers NOT_COORDINATOR / loading for a moment.
                if kafka_error(e).code() in _RETRY and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(1.0, delay * 2)
                    continue
                raise self._unreachable(f"reading group {group!r}'s offsets of {topic!r}",
                                        e) from e
            finally:
                c.close()
            errors = [tp.error for tp in tps if tp.error is not None]
            if errors and all(e.code() in _RETRY for e in errors) and time.monotonic() < deadline:
                time.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            bad = [f"{tp.partition}: {tp.error}" for tp in tps if tp.error is not None]
            if bad:
                raise BusError(f"reading group {group!r}'s offsets of {topic!r}: "
                               f"{'; '.join(bad)}")
            return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}

    def lag(self, group: str, topic: str) -> dict[int, int]:
        done = self.committed(group, topic)
        ends = self.end_offsets(topic, self.partitions(topic))
        return {p: max(0, hi - done.get(p, lo)) for p, (lo, hi) in ends.items()}

    def close(self) -> None:
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None
        if self._admin is not None:
            self._admin.poll(0)
            self._admin = None


