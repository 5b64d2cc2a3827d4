"""The Kafka bus's producer and consumer (confluent-kafka); what they share with the bus and
its readers (error classes, log routing, polling) is :mod:`astraflow.core.bus.kafka_common`.

Imported only through :mod:`astraflow.core.bus.kafka`, itself imported lazily by ``connect()``,
so confluent-kafka is needed only by those who use the Kafka bus.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from astraflow.core.bus.kafka_common import (
    _REBALANCE,
    _REBALANCING,
    _RETRY,
    _TRANSIENT,
    _UNKNOWN_TOPIC,
    COMMIT_RETRY_S,
    OVERHEAD,
    REVOKE_COMMIT_RETRY_S,
    TIMEOUT,
    ClientLog,
    E,
    ck,
    ck_admin,
    consume_many,
    kafka_error,
    log,
    poll_one,
    to_message,
    too_large_message,
    watermarks,
)
from astraflow.core.bus.types import Headers, Message, RebalanceCallback
from astraflow.core.errors import BusError, CommitError, RecordTooLargeError, TopicError

if TYPE_CHECKING:
    from astraflow.core.bus.kafka import KafkaBus


class KafkaProducer:
    """An idempotent, zstd-compressing producer that routes keys with murmur2."""

    def __init__(self, bus: KafkaBus, *, client_id: str = "") -> None:
        self._bus = bus
        self._max = bus.max_message_bytes
        self._log = ClientLog(bus.bootstrap)
        self._p = ck.Producer(bus.client_config({
            "client.id": client_id or "astraflow-producer",
            "enable.idempotence": True,  # librdkafka's default is off, unlike Java's
            "acks": "all",
            "compression.type": "zstd",
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # as Java and the embedded bus
            "message.max.bytes": max(1_000_000, self._max + OVERHEAD),
            "on_delivery": self._on_delivery,
        }, self._log))
        self._partitions: dict[str, int] = {}
        self._failures: list[tuple[ck.KafkaError, str, str, int]] = []
        self._failed = 0

    def _on_delivery(self, err: ck.KafkaError | None, msg: Any) -> None:
        if err is None:
            return
        self._failed += 1
        if len(self._failures) < 10:
            size = len(msg.value() or b"") + len(msg.key() or b"")
            self._failures.append((err, msg.topic(), f"{msg.topic()}[{msg.partition()}]", size))

    def _partition_count(self, topic: str, refresh: bool = False) -> int:
        n = self._partitions.get(topic)
        if n is not None and not refresh:
            return n
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                t = self._p.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
            except ck.KafkaException as e:
                raise BusError(f"metadata for topic {topic!r} from {self._bus.bootstrap}: "
                               f"{kafka_error(e).str()}; is the broker running?") from e
            if t is None or (t.error is not None and t.error.code() in _UNKNOWN_TOPIC):
                raise TopicError(f"topic {topic!r} does not exist on {self._bus.bootstrap}; "
                                 "create it with bus.create_topics (automatic creation is off)")
            if t.partitions:
                break
            if time.monotonic() > deadline:  # e.g. LEADER_NOT_AVAILABLE for too long
                raise BusError(f"metadata for topic {topic!r}: {t.error}")
            time.sleep(0.05)
        self._partitions[topic] = len(t.partitions)
        return len(t.partitions)

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None,
                headers: Headers | None = None, partition: int | None = None) -> None:
        self._log.check("producer")
        size = len(value) + len(key or b"") + sum(
            len(k.encode()) + len(v or b"") for k, v in headers or ())
        if size > self._max:
            raise RecordTooLargeError(too_large_message(
                topic, size, self._max, "the bus's limit (max_message_bytes)"))
        n = self._partition_count(topic)
        if partition is not None and not 0 <= partition < n:
            n = self._partition_count(topic, refresh=True)  # partitions may have been added
            if not 0 <= partition < n:
                raise TopicError(f"partition {partition} of topic {topic!r} does not exist; "
                                 f"it has {n} (0..{n - 1})")
        kwargs: dict[str, Any] = {"value": value, "key": key}
        if headers:
            kwargs["headers"] = headers
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._p.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: serve deliveries to drain it
                self._p.poll(0.1)
            except ck.KafkaException as e:
                err = kafka_error(e)
                if err.code() == E.MSG_SIZE_TOO_LARGE:
                    raise RecordTooLargeError(too_large_message(
                        topic, size, self._max, "librdkafka's message.max.bytes")) from e
                if err.code() in _UNKNOWN_TOPIC:
                    raise TopicError(f"topic {topic!r}: {err.str()}") from e
                raise BusError(f"producing to {topic!r}: {err.str()}") from e
        self._p.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        left = self._p.flush() if timeout is None else self._p.flush(timeout)
        if left:
            raise BusError(f"{left} record(s) not acknowledged by kafka at {self._bus.bootstrap} "
                           f"within {timeout}s; is the broker running?")
        self._raise_failures()

    def _topic_limit(self, topic: str) -> str:
        """The topic's max.message.bytes, for the error message (best effort)."""
        try:
            res = ck_admin.ConfigResource(ck_admin.ConfigResource.Type.TOPIC, topic)
            fut = self._bus.admin.describe_configs([res], request_timeout=5)[res]
            return f"{int(fut.result(timeout=5)['max.message.bytes'].value):,}"
        except Exception:  # noqa: BLE001 - only decorates an error message
            return "(unknown)"

    def _raise_failures(self) -> None:
        if not self._failed:
            return
        failures, count = self._failures, self._failed
        self._failures, self._failed = [], 0
        for err, topic, where, size in failures:
            if err.code() == E.MSG_SIZE_TOO_LARGE:
                raise RecordTooLargeError(
                    f"the broker refused {count} record(s) ({where}): " + too_large_message(
                        topic, size, self._topic_limit(topic),
                        "the topic's limit (max.message.bytes)"))
        first = "; ".join(f"{where}: {err.str()}" for err, _t, where, _s in failures[:5])
        if all(err.code() in _UNKNOWN_TOPIC for err, *_ in failures):
            raise TopicError(f"{count} record(s) failed, topic unknown: {first}")
        raise BusError(f"{count} record(s) were not delivered to {self._bus.bootstrap}: {first}")

    def close(self) -> None:
        """Flush (every record acknowledged, or its failure raised), then close. Where the
        flush did not end (interrupted: a signal, a stop), the records still queued are purged
        first: librdkafka's close would wait for them up to ``message.timeout.ms`` (5 min by
        default) inside C code that no signal reaches."""
        flushed = False
        try:
            self.flush()
            flushed = True
        finally:
            if not flushed:
                with contextlib.suppress(Exception):
                    self._p.purge()
                    self._p.poll(0)
            close = getattr(self._p, "close", None)  # confluent-kafka >= 2.13
            if close is not None:
                close()


class KafkaConsumer:
    """A member of a consumer group (cooperative-sticky) that commits only when asked."""

    def __init__(self, bus: KafkaBus, group: str, topics: list[str], *, client_id: str,
                 start: str, session_timeout: float, on_assign: RebalanceCallback | None,
                 on_revoke: RebalanceCallback | None) -> None:
        self.group = group
        self._client_id = client_id or f"astraflow-{group}"
        self.member_id = self._client_id  # the broker's member id once joined
        self._start = start
        self._user_assign, self._user_revoke = on_assign, on_revoke
        self._log = ClientLog(bus.bootstrap)
        session_ms = max(1, round(session_timeout * 1000))
        conf = bus.client_config({
            "group.id": group,
            "client.id": self._client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(50, session_ms // 4),
            "max.poll.interval.ms": max(300_000, session_ms),
            "auto.offset.reset": start,
            "enable.partition.eof": False,
        }, self._log)
        self._cooperative = "cooperative" in str(conf["partition.assignment.strategy"])
        self._c = ck.Consumer(conf)
        self._assigned: set[tuple[str, int]] = set()
        self._pending: dict[tuple[str, int], int] = {}  # newest delivered, not yet committed
        self._lost: set[tuple[str, int]] = set()  # delivered, then revoked before a commit
        self._next: dict[tuple[str, int], int] = {}
        self._closed = False
        self._revoking = False  # inside a revocation callback (see REVOKE_COMMIT_RETRY_S)
        self._c.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                          on_lost=self._on_lost)

    # ---- rebalances (served inside poll/consume/close)

    def _start_offsets(self, parts: list[Any]) -> list[Any]:
        """With start="latest", pin each partition without a committed offset to its end now,
        so records produced once assignment() lists it are delivered (librdkafka would
        otherwise resolve "latest" later, skipping records produced in between)."""
        fresh = [ck.TopicPartition(tp.topic, tp.partition) for tp in parts]
        try:
            committed = self._c.committed(fresh, timeout=TIMEOUT)
            out = []
            for tp in committed:
                off = tp.offset
                if off < 0:
                    _lo, off = watermarks(self._c, tp.topic, tp.partition)
                out.append(ck.TopicPartition(tp.topic, tp.partition, off))
                self._next[(tp.topic, tp.partition)] = off
            return out
        except ck.KafkaException as e:
            log.warning("group=%s could not pin start offsets (%s); librdkafka resolves them",
                        self.group, kafka_error(e).str())
            return parts

    def _on_assign(self, consumer: Any, parts: list[Any]) -> None:
        pairs = [(tp.topic, tp.partition) for tp in parts]
        for pair in pairs:
            self._next.pop(pair, None)
            self._lost.discard(pair)  # back: its records come again from the committed offset
        tps = self._start_offsets(parts) if self._start == "latest" and parts else parts
        if self._cooperative:
            consumer.incremental_assign(tps)
            self._assigned.update(pairs)
        else:
            consumer.assign(tps)
            self._assigned = set(pairs)
        self.member_id = consumer.memberid() or self._client_id
        log.info("group=%s member=%s assigned=%s", self.group, self.member_id, pairs)
        if pairs and self._user_assign is not None:
            self._user_assign(pairs)

    def _drop(self, pairs: list[tuple[str, int]]) -> None:
        for pair in pairs:
            self._assigned.discard(pair)
            self._next.pop(pair, None)
            if self._pending.pop(pair, None) is not None:
                self._lost.add(pair)

    def _unassign(self, consumer: Any, parts: list[Any]) -> None:
        if self._cooperative:
            consumer.incremental_unassign(parts)
        else:
            consumer.unassign()

    def _on_revoke(self, consumer: Any, parts: list[Any]) -> None:
        pairs = [(tp.topic, tp.partition) for tp in parts]
        log.info("group=%s member=%s revoked=%s", self.group, self.member_id, pairs)
        self._revoking = True
        try:
            if pairs and self._user_revoke is not None:
                self._user_revoke(pairs)  # may still commit: the partitions are ours until return
        finally:
            self._revoking = False
            self._drop(pairs)
            self._unassign(consumer, parts)

    def _on_lost(self, consumer: Any, parts: list[Any]) -> None:
        pairs = [(tp.topic, tp.partition) for tp in parts]
        log.warning("group=%s member=%s lost=%s (session expired?)", self.group, self.member_id,
                    pairs)
        self._drop(pairs)  # already someone else's: commits for them must fail
        try:
            if pairs and self._user_revoke is not None:
                self._user_revoke(pairs)
        finally:
            self._unassign(consumer, parts)

    # ---- reading

    def _message(self, msg: Any) -> Message | None:
        err = msg.error()
        if err is not None:
            self._on_error(err, msg)
            return None
        topic, part, off = msg.topic(), msg.partition(), msg.offset()
        self._pending[(topic, part)] = off
        self._next[(topic, part)] = off + 1
        return to_message(msg)

    def _on_error(self, err: ck.KafkaError, msg: Any) -> None:
        where = f"{msg.topic()}[{msg.partition()}]" if msg.topic() else ""
        if err.code() in _TRANSIENT or err.retriable():
            self._log.noise(f"group={self.group} {where} {err.str()}")
            return
        if err.code() in _UNKNOWN_TOPIC:
            raise TopicError(f"group {self.group!r}: {where or 'topic'}: {err.str()}")
        raise BusError(f"group {self.group!r} consumer error {where}: {err.str()}")

    def poll(self, timeout: float = 1.0) -> Message | None:
        self._log.check("consumer")
        return poll_one(self._c, self._message, timeout)

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[Message]:
        if max_records <= 0:
            return []
        self._log.check("consumer")
        return consume_many(self._c, self._message, max_records, timeout)

    # ---- offsets

    def commit(self, messages: Message | Sequence[Message] | None = None) -> None:
        """Commit synchronously. Partitions this member owns are committed; then CommitError
        names the ones it no longer owns (their records will be delivered again): with
        ``messages``, those not assigned now; with None, those revoked or lost with
        uncommitted deliveries that have not come back; and every partition of the call when
        the broker says the membership itself is gone (an expired session)."""
        if messages is None:
            offsets = dict(self._pending)
            lost, self._lost = set(self._lost), set()
        else:
            msgs = [messages] if isinstance(messages, Message) else list(messages)
            offsets = {}
            for m in msgs:
                pair = (m.topic, m.partition)
                offsets[pair] = max(offsets.get(pair, -1), m.offset)
            lost = {pair for pair in offsets if pair not in self._assigned}
            self._lost -= lost  # named now: not again by the next commit(None)
        for pair in lost:
            offsets.pop(pair, None)
        why = "no longer assigned to this member"
        if offsets:
            refusal = self._commit(offsets)
            if refusal is not None:
                lost |= set(offsets)
                why = refusal
        if lost:
            names = ", ".join(f"{t}[{p}]" for t, p in sorted(lost))
            raise CommitError(f"group {self.group!r} member {self.member_id}: cannot commit "
                              f"{names}: {why}; those records will be delivered again")

    def _commit(self, offsets: dict[tuple[str, int], int]) -> str | None:
        """Commit ``offsets`` (partition -> newest processed offset); None when done, or why
        the broker refused every one of them because this membership is gone."""
        tps = [ck.TopicPartition(t, p, off + 1) for (t, p), off in offsets.items()]
        what = ", ".join(f"{t}[{p}]@{off + 1}" for (t, p), off in sorted(offsets.items()))
        retry_s = REVOKE_COMMIT_RETRY_S if self._revoking else COMMIT_RETRY_S
        deadline = time.monotonic() + retry_s
        delay = 0.1
        while True:
            try:
                res = self._c.commit(offsets=tps, asynchronous=False)
                bad = [tp.error for tp in res or () if tp.error is not None]
                err = bad[0] if bad else None
            except ck.KafkaException as e:
                err = kafka_error(e)
            if err is None or err.code() == E._NO_OFFSET:
                break
            rebalancing = err.code() in _REBALANCING and self._cooperative
            if err.code() in _REBALANCE and not rebalancing:
                return (f"the group refused the commit ({err.str()}): this member's session "
                        "expired or a rebalance moved the partitions")
            if (rebalancing or err.code() in _RETRY or err.retriable()) and \
                    time.monotonic() < deadline:
                self._log.noise(f"group={self.group} commit: {err.str()}; retrying")
                time.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            if rebalancing:
                return f"the group was still rebalancing after {retry_s:.0f}s" + (
                    " (inside a revocation, which the round waits for)" if self._revoking
                    else "")
            raise BusError(f"group {self.group!r} commit of {what} failed: {err.str()}")
        for pair, off in offsets.items():
            if self._pending.get(pair, -1) <= off:
                self._pending.pop(pair, None)
        return None

    def assignment(self) -> list[tuple[str, int]]:
        return sorted(self._assigned)

    def position(self, topic: str, partition: int) -> int | None:
        pair = (topic, partition)
        if pair not in self._assigned:
            return None
        if pair in self._next:
            return self._next[pair]
        tp = ck.TopicPartition(topic, partition)
        try:
            pos = self._c.position([tp])[0].offset
            if pos >= 0:
                return int(pos)
            committed = self._c.committed([tp], timeout=TIMEOUT)[0].offset
            if committed >= 0:
                return int(committed)
            lo, hi = watermarks(self._c, topic, partition)
        except ck.KafkaException as e:
            raise BusError(f"position of {topic}[{partition}]: {kafka_error(e).str()}") from e
        return int(lo if self._start == "earliest" else hi)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        pair = (topic, partition)
        if pair not in self._assigned:
            raise BusError(f"cannot seek {topic}[{partition}]: not assigned to member "
                           f"{self.member_id} of group {self.group!r}; assigned: "
                           f"{self.assignment()}")
        tp = ck.TopicPartition(topic, partition, offset)
        try:
            self._c.seek(tp)
        except ck.KafkaException as e:
            if kafka_error(e).code() != E._STATE or not self._cooperative:
                raise BusError(f"seek {topic}[{partition}]@{offset}: "
                               f"{kafka_error(e).str()}") from e
            # Assigned but not fetching yet: seek() is refused, an assignment with the offset
            # is the way to set where fetching starts.
            self._c.incremental_unassign([ck.TopicPartition(topic, partition)])
            self._c.incremental_assign([tp])
        self._next[pair] = offset

    def close(self) -> None:
        """Leave the group (on_revoke runs for the partitions held); commits nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._c.close()
        except ck.KafkaException as e:
            if kafka_error(e).code() != E._NO_OFFSET:
                log.warning("group=%s closing consumer: %s", self.group, kafka_error(e).str())
