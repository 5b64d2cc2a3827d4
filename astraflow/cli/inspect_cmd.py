"""`astraflow inspect TOPIC [--from earliest|latest|P:OFFSET,...] [--limit N] [--follow]`: print
a topic's records as JSON lines (bytes as base64), read without a consumer group."""

from __future__ import annotations

import base64
import sys
from typing import Annotated, Any

import typer

from astraflow.cli.common import DEFAULT_BUS, BusOption, RunDirOption, existing_bus


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


def parse_start(value: str) -> str | dict[int, int]:
    """``--from``: ``earliest``, ``latest``, or ``P:OFFSET[,P:OFFSET...]`` (partitions not
    named start at the earliest)."""
    if value in ("earliest", "latest"):
        return value
    offsets: dict[int, int] = {}
    for part in value.split(","):
        p, sep, off = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            offsets[int(p)] = int(off)
        except ValueError:
            raise typer.BadParameter(
                f"{value!r}: use earliest, latest, or PARTITION:OFFSET[,PARTITION:OFFSET...] "
                "(e.g. 0:120,3:40)", param_hint="--from") from None
    return offsets


def inspect(
    topic: str,
    start: Annotated[str, typer.Option(
        "--from", help="Where to start: earliest, latest, or PARTITION:OFFSET[,...] (other "
        "partitions from the earliest).")] = "earliest",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new records.")]
    = False,
    limit: Annotated[int | None, typer.Option("--limit", "--max", "-n",
                                              help="Stop after N records.")] = None,
    latest: Annotated[bool, typer.Option(help="Same as --from latest.", hidden=True)] = False,
    bus: BusOption = DEFAULT_BUS,
    out: RunDirOption = None,
) -> None:
    """Print the records of TOPIC as JSON lines: origin (topic[partition]@offset), key,
    headers and the decoded record. Without --follow, stops after the records that exist now.
    Reads without joining a consumer group: nothing is committed, nothing is left behind (an
    embedded bus that does not exist is an error, never created)."""
    from astraflow.core.bus import connect

    where = parse_start("latest" if latest else start)
    b = connect(existing_bus(bus, out, "astraflow inspect"))
    try:
        ends = b.describe_topic(topic).end_offsets  # also a clear error for an unknown topic
        reader = b.reader(topic, start=where, client_id="inspect")
    except BaseException:
        b.close()
        raise
    # Without --follow: stop once every record that existed at start has been printed.
    pending = {p: end for p, end in ends.items() if reader.position(p) < end}
    seen = 0
    stdout = sys.stdout.buffer
    try:
        while (limit is None or seen < limit) and (follow or pending):
            msgs = reader.consume(500 if limit is None else min(500, limit - seen), 0.5)
            for m in msgs:
                if follow or m.offset < ends.get(m.partition, 0):
                    stdout.write(message_json(m) + b"\n")
                    seen += 1
            stdout.flush()
            pending = {p: end for p, end in pending.items() if reader.position(p) < end}
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        b.close()
