"""Closing Kafka clients when the broker has gone silent: an interrupted close must not sit
inside librdkafka, where no signal reaches, until message.timeout.ms (5 min) runs out. No
broker is needed: the "broker" is a listener that accepts connections and never answers."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from astraflow.core.bus import connect


class Interrupted(Exception):
    pass


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """``host:port`` of a listener that takes connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


def test_an_interrupted_producer_close_returns_at_once(silent_broker: str) -> None:
    bus = connect(f"kafka://{silent_broker}")
    producer = bus.producer()
    # the partition count a producer learned before its broker went silent (here it never
    # spoke: the cache is seeded, as the first produce to a topic would have filled it)
    producer._partitions["t"] = 1
    producer.produce("t", b"a record the broker will never acknowledge", key=b"k")

    def interrupt(*_: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    began = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            producer.close()  # flush waits for the acknowledgement; the signal ends it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # before the queued records were purged, librdkafka's close held on to them here for
    # message.timeout.ms (over a minute measured, then the measurement was cut off)
    assert time.monotonic() - began < 15
    bus.close()
