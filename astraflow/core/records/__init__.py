"""The wire format: one typed, versioned msgpack schema per record type
(docs/reference/wire-format.md).

Every record is a msgpack *map*. Two keys are present on every record:

* ``schema`` — the record type name (``"Task"``, ``"Trajectory"``, ...), and
* ``v`` — the schema version of that type (an int, currently 1 for all).

The remaining keys are the fields below, by name. Numeric arrays (token ids, logprobs, masks,
per-token versions) are msgpack ``bin`` values holding packed little-endian arrays (``<i4`` for
ints, ``<f4`` for floats, ``u1`` for masks), never lists of numbers. No pickle anywhere: any
msgpack decoder in any language reads these records. Kafka messages additionally carry the
header ``af-schema: <schema>/<v>``.

Decoding validates types and required fields and rejects unknown schema versions with a
:class:`~astraflow.core.errors.SchemaError` that names the record and the field.

Field docs say who writes a field, who reads it, and what "absent" (the default) means. The
records live in :mod:`~astraflow.core.records.episodes` (the data path),
:mod:`~astraflow.core.records.control` (weights, metrics, load, dead letters, claims) and
:mod:`~astraflow.core.records.gateway`; the packed arrays in
:mod:`~astraflow.core.records.base`, encoding in :mod:`~astraflow.core.records.codec`. Import
them from here.

Modules:

- :mod:`.base`: The base of every record (its schema name and version) and the packed numeric
  arrays records carry (little-endian ``<i4``, ``<f4``, ``u1`` bytes.
- :mod:`.checks`: The values of a trajectory checked against the run's own facts, at the door of
  every role that trusts them.
- :mod:`.codec`: Encoding and decoding records: msgpack bytes <-> typed, validated records, and the
  ``af-schema`` header (see :mod:`astraflow.core.records`).
- :mod:`.control`: The records around the data path: weight versions, heartbeats and metrics, load
  reports, dead letters and claim checks.
- :mod:`.episodes`: The records of the data path: tasks in, trajectories out of rollout, their
  groups and statistics through the policies, and batches to the trainer.
- :mod:`.gateway`: The agent gateway's records: one event of a session per record (see
  :mod:`astraflow.core.records` for the wire format).
"""

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
