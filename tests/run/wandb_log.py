"""Reads back an offline wandb run (its ``run-<id>.wandb`` file) for the sink tests: the file
is wandb's transaction log, LevelDB's log format (32 KiB blocks of records with a 7-byte
header: crc32c, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte file header ``:W&B``,
each record one ``wandb.proto.wandb_internal_pb2.Record``. The wandb package ships no Python
reader of it (``wandb sync`` is in its Go core), so the test parses the framing and leaves
every record to wandb's own protobuf."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
RECORD_HEADER = struct.Struct("<IHB")  # crc32c, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every Record of the log at ``path``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = FILE_HEADER.unpack_from(data, 0)
    assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic)
    pos, out, pending = FILE_HEADER.size, [], b""
    while pos + RECORD_HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding
            pos += left
            continue
        body = data[pos + RECORD_HEADER.size:pos + RECORD_HEADER.size + length]
        pos += RECORD_HEADER.size + length
        pending = body if kind in (FULL, FIRST) else pending + body
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The logged rows, each a dict key -> value."""
    return [{item.key or ".".join(item.nested_key): json.loads(item.value_json)
             for item in r.history.item}
            for r in records(path) if r.WhichOneof("record_type") == "history"]


def run_info(path: Path) -> tuple[str, dict[str, Any]]:
    """The run's display name and config (key -> value)."""
    for r in records(path):
        if r.WhichOneof("record_type") == "run":
            return r.run.display_name, {i.key: json.loads(i.value_json)
                                        for i in r.run.config.update}
    raise AssertionError(f"no run record in {path}")
