"""Whether a starting local broker serves clients yet (:meth:`LocalBroker.start` polls it)."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

from astraflow.core.broker.jars import tail_text

log = logging.getLogger("astraflow.broker")


def tail_file(path: Path, lines: int = 25) -> str:
    """The last ``lines`` of ``path`` (empty when unreadable)."""
    try:
        return tail_text(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


class Probe:
    """Asks the broker whether it serves clients: metadata through the admin client, or (without
    confluent-kafka) the "Kafka Server started" line in its log plus an open port."""

    def __init__(self, bootstrap: str, log_file: Path) -> None:
        self.bootstrap = bootstrap
        self.log_file = log_file
        self.admin: Any = None
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:
            return
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "logger": _DebugLog(),
            "error_cb": lambda err: log.debug("probe: %s", err),
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 250,
        }
        self.admin = AdminClient(conf)

    def ready(self, timeout: float) -> bool:
        if self.admin is not None:
            from confluent_kafka import KafkaException

            try:
                md = self.admin.list_topics(timeout=timeout)
            except KafkaException:
                return False
            finally:
                self.admin.poll(0)
            return bool(md.brokers)
        host, _, port = self.bootstrap.rpartition(":")
        if "Kafka Server started" not in tail_file(self.log_file, 200):
            time.sleep(min(timeout, 0.2))
            return False
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.admin = None


class _DebugLog:
    """A librdkafka ``logger`` that keeps the probe's connection-refused lines at DEBUG."""

    def log(self, _level: int, fmt: str, *args: object) -> None:
        log.debug("probe: " + fmt, *args)
