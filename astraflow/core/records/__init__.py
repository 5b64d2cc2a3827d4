"""The wire format: one typed, versioned msgpack schema per record type
(docs/reference/wire-format.md).

Every record is a msgpack map with ``schema`` (the type name) and ``v`` (its version) plus its
fields; numeric arrays are packed little-endian ``bin`` values, never pickle. Decoding
validates and raises :class:`~astraflow.core.errors.SchemaError` naming the record and field.
Import records from here.

Modules:

- :mod:`.base`: the base of every record and the packed numeric arrays.
- :mod:`.checks`: a trajectory's values checked against the run's own facts.
- :mod:`.codec`: msgpack bytes <-> typed, validated records, and the ``af-schema`` header.
- :mod:`.control`: weight versions, heartbeats, metrics, load reports, dead letters, claims.
- :mod:`.episodes`: the data path: tasks, trajectories, groups, statistics, batches.
- :mod:`.gateway`: the agent gateway's records: one session event per record."""

from astraflow.core.records.base import (
    SCHEMA_HEADER,
    Record,
    pack_f32,
    pack_i32,
    pack_u8,
    unpack,
)
from astraflow.core.records.codec import (
    SCHEMAS,
    AnyRecord,
    decode,
    decode_many,
    encode,
    schema_header,
    to_builtins,
)
from astraflow.core.records.control import (
    AdapterSpec,
    BlobPart,
    Claim,
    DeadLetter,
    LoadReport,
    Metric,
    PolicyLoad,
    TensorEntry,
    WeightManifest,
    WorkerStatus,
)
from astraflow.core.records.episodes import (
    Batch,
    ChatMessage,
    Group,
    GroupStats,
    Task,
    Trajectory,
    TrajectoryGroup,
    TrajRef,
    TurnSpan,
    assistant_turns,
)
from astraflow.core.records.gateway import (
    GatewayCall,
    GatewayChoice,
)

__all__ = [
    "AnyRecord",
    "Batch",
    "BlobPart",
    "ChatMessage",
    "Claim",
    "DeadLetter",
    "GatewayCall",
    "GatewayChoice",
    "Group",
    "GroupStats",
    "LoadReport",
    "Metric",
    "PolicyLoad",
    "Record",
    "SCHEMAS",
    "SCHEMA_HEADER",
    "Task",
    "AdapterSpec",
    "TensorEntry",
    "TrajRef",
    "Trajectory",
    "TrajectoryGroup",
    "TurnSpan",
    "WeightManifest",
    "WorkerStatus",
    "assistant_turns",
    "decode",
    "decode_many",
    "encode",
    "pack_f32",
    "pack_i32",
    "pack_u8",
    "schema_header",
    "to_builtins",
    "unpack",
]
