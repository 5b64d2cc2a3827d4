"""`astraflow inspect TOPIC`: print a topic's records as JSON lines (bytes as base64)."""

from __future__ import annotations

import base64
import sys
from typing import Annotated, Any

import typer

from astraflow.cli.common import DEFAULT_BUS, BusOption


def message_json(msg: Any) -> bytes:
    """One JSON line for a bus message: its address, key, headers and decoded record (or
    the decode error and the raw bytes)."""
    import msgspec

    from astraflow.core.errors import SchemaError
    from astraflow.core.records import decode, to_builtins

    def b64(b: bytes | None) -> str | None:
        return None if b is None else base64.b64encode(b).decode()

    line: dict[str, Any] = {
        "origin": msg.origin,
        "timestamp": msg.timestamp,
        "key": msg.key.decode("utf-8", "replace") if msg.key is not None else None,
        "headers": {k: v.decode("utf-8", "replace") for k, v in msg.headers},
    }
    try:
        line["record"] = to_builtins(decode(msg.value))
    except SchemaError as e:
        line["error"] = str(e)
        line["raw_base64"] = b64(msg.value)
    return msgspec.json.encode(line)


def inspect(
    topic: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new records.")]
    = False,
    limit: Annotated[int | None, typer.Option("--max", "-n", help="Stop after N records.")] = None,
    latest: Annotated[bool, typer.Option(help="Start at the end (with --follow).")] = False,
    bus: BusOption = DEFAULT_BUS,
) -> None:
    """Print the records of TOPIC as JSON lines. Reads without committing: a group of its own."""
    from astraflow.core.bus import connect
    from astraflow.core.topics import reader_group

    b = connect(bus)
    ends = b.describe_topic(topic).end_offsets  # also a clear error for an unknown topic
    # Without --follow: stop once every record that existed at start has been printed.
    pending = {p: end - 1 for p, end in ends.items() if end > 0}
    consumer = b.consumer(reader_group("inspect", topic), [topic],
                          start="latest" if latest else "earliest")
    seen = 0
    out = sys.stdout.buffer
    try:
        while (limit is None or seen < limit) and (follow or (pending and not latest)):
            batch = 500 if limit is None else min(500, limit - seen)
            msgs = consumer.consume(batch, 0.5)
            for m in msgs:
                out.write(message_json(m) + b"\n")
                if pending.get(m.partition, -1) <= m.offset:
                    pending.pop(m.partition, None)
            out.flush()
            seen += len(msgs)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        b.close()
