"""The wire format: one typed, versioned msgpack schema per record type (DESIGN.md §3).

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

Field docs say who writes a field, who reads it, and what "absent" (the default) means.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import msgspec

from astraflow.core.errors import SchemaError

if TYPE_CHECKING:
    import numpy as np

SCHEMA_HEADER = "af-schema"


class Record(msgspec.Struct, kw_only=True, tag_field="schema", omit_defaults=False):
    """Base of every record. ``v`` is the schema version; ``schema`` (the tag) its type name."""

    SCHEMA_VERSION: ClassVar[int] = 1
    v: int = 1

    def __post_init__(self) -> None:
        if self.v != self.SCHEMA_VERSION:
            raise SchemaError(
                f"unknown schema version {self.v} for {type(self).__name__} (this build reads "
                f"version {self.SCHEMA_VERSION}); upgrade the reader or re-produce the record"
            )

    @classmethod
    def schema_name(cls) -> str:
        return cls.__struct_config__.tag  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# packed numeric arrays
# ---------------------------------------------------------------------------------------------

_LITTLE = sys.byteorder == "little" and array("i").itemsize == array("f").itemsize == 4


def _pack_list(values: object, code: str) -> bytes | None:
    """A list packed by the stdlib ``array`` (several times cheaper than numpy on the short
    per-token lists of one episode), or None where only numpy gives the documented result
    (other iterables, a big-endian host, elements ``array`` refuses such as floats for ints)."""
    if type(values) is not list or not _LITTLE:
        return None
    try:
        return array(code, values).tobytes()
    except TypeError:
        return None


def pack_i32(values: Iterable[int] | np.ndarray) -> bytes:
    """Pack ints as little-endian int32 bytes (token ids, versions)."""
    fast = _pack_list(values, "i")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="<i4")).tobytes()


def pack_f32(values: Iterable[float] | np.ndarray) -> bytes:
    """Pack floats as little-endian float32 bytes (logprobs)."""
    fast = _pack_list(values, "f")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="<f4")).tobytes()


def pack_u8(values: Iterable[int] | np.ndarray) -> bytes:
    """Pack 0/1 flags as uint8 bytes (loss masks)."""
    fast = _pack_list(values, "B")
    if fast is not None:
        return fast
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype="u1")).tobytes()


def unpack(data: bytes, dtype: str) -> np.ndarray:
    """Read a packed array (read-only numpy view). ``dtype`` is ``"<i4"``, ``"<f4"`` or ``"u1"``."""
    import numpy as np

    if len(data) % np.dtype(dtype).itemsize:
        raise SchemaError(f"packed array of {len(data)} bytes is not a whole number of {dtype}")
    return np.frombuffer(data, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------

class ChatMessage(msgspec.Struct, kw_only=True):
    """One message of a conversation (OpenAI chat shape)."""

    role: str
    content: str
    name: str | None = None  # tool name for role="tool"; absent otherwise


class Task(Record, tag="Task", kw_only=True):
    """A unit of rollout work. Key: ``id``. Written by producers/gate, read by rollout workers."""

    id: str
    dataset: str
    prompt: list[ChatMessage]
    reference: dict[str, Any] = {}  # answer / tests for the reward; absent: no reference
    workflow: str = "single_turn"  # registered name or "module:function"
    n_samples: int = 1  # trajectories to produce per policy (the group size)
    attempt: int = 0  # 0 on first release; +1 each time the task is re-released
    group_id: str = ""  # one group per (task, attempt); absent: f"{id}#{attempt}"
    metadata: dict[str, str] = {}
    created_at: float = msgspec.field(default_factory=time.time)

    def resolved_group_id(self) -> str:
        return self.group_id or f"{self.id}#{self.attempt}"


class TurnSpan(msgspec.Struct, kw_only=True, array_like=False):
    """A half-open token range [start, end) of a trajectory and who wrote it."""

    start: int
    end: int
    role: str  # "prompt", "assistant", "tool", "user", ...


def assistant_turns(spans: Sequence[TurnSpan]) -> int:
    """How many assistant turns ``spans`` hold (what ``Trajectory.turn_rewards`` counts)."""
    return sum(s.role == "assistant" for s in spans)


class Trajectory(Record, tag="Trajectory", kw_only=True):
    """One episode's tokens for one policy. Key: ``group_id``. Rollout → assembler.

    Arrays are aligned per token over the whole sequence (prompt + every turn):
    ``token_ids`` <i4, ``loss_mask`` u1 (1 = generated by this policy, trained on),
    ``logprobs`` <f4 (behaviour logprob; 0 where mask is 0), ``versions`` <i4 (policy version
    that generated the token; -1 where mask is 0).
    """

    id: str
    task_id: str
    group_id: str
    policy: str = "default"
    # The workflow role that produced this trajectory ("solver", "verifier", ...), written by
    # the rollout worker from the workflow's draft; read by the assembler, which groups by
    # (policy, agent, group id) so that a policy playing two roles in one episode has one
    # group (one normalisation) per role. Absent (""): a single-role workflow, or a record
    # from before this field: grouped by (policy, group id) as before.
    agent: str = ""
    sample_index: int = 0
    group_size: int = 0  # trajectories of this policy in the group (the task's n_samples); 0: unknown
    token_ids: bytes
    loss_mask: bytes
    logprobs: bytes
    versions: bytes
    prompt_len: int = 0
    spans: list[TurnSpan] = []  # absent: one prompt span and one completion span implied
    reward: float = 0.0
    rewards: dict[str, float] = {}  # named reward components; absent: only ``reward``
    # One reward per assistant turn (the ``spans`` of role "assistant", in order), when the
    # workflow scores its turns apart (a solver's first answer by itself, its retry by the
    # final answer). The trainer then normalises each turn within the group among the members
    # that have it, and gives every token its turn's advantage (tokens before the first
    # assistant span take the first turn's, others the turn they follow). ``reward`` stays the
    # trajectory's scalar (statistics, filters). Absent ([]): every turn gets ``reward``.
    turn_rewards: list[float] = []
    finish_reason: Literal["stop", "length", "error", "timeout", "aborted"] = "stop"
    error: str | None = None  # set when finish_reason == "error"
    worker_id: str = ""
    timings: dict[str, float] = {}  # seconds: "generate", "reward", "total", ...
    # The weight version of every policy the producing worker hosts, as its engines stood when
    # the episode's records were written (its end): what the episode was produced under when
    # several policies act in it (a solver's reward depends on the verifier that judged it).
    # Written by the rollout worker; read by whoever judges cross-policy freshness (metrics,
    # filters). The trajectory's own policy is also in the per-token ``versions``, which stay
    # the exact record of its tokens. Absent ({}): not recorded (a record from before this
    # field, or one written outside a worker); readers fall back to ``versions``.
    version_vector: dict[str, int] = {}
    created_at: float = msgspec.field(default_factory=time.time)

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(self.token_ids) // 4
        if len(self.token_ids) % 4:
            raise SchemaError("token_ids is not a whole number of int32")
        for name, size in (("loss_mask", 1), ("logprobs", 4), ("versions", 4)):
            if len(getattr(self, name)) != n * size:
                raise SchemaError(f"{name} has {len(getattr(self, name)) // size} entries, "
                                 f"token_ids has {n}; every per-token array must align")
        if self.turn_rewards:
            turns = assistant_turns(self.spans)
            if len(self.turn_rewards) != turns:
                raise SchemaError(f"turn_rewards has {len(self.turn_rewards)} entries, spans "
                                  f"have {turns} assistant turns; one reward per turn")


class GroupStats(Record, tag="GroupStats", kw_only=True):
    """Reward statistics of one finished group. Key: ``task_id``. Assembler → gate (GRESO)."""

    task_id: str
    group_id: str
    policy: str = "default"
    # The role of the group's trajectories (``Trajectory.agent``); written by the assembler.
    # With ``policy`` and ``group_id`` it names the group: a policy playing two roles gets
    # two GroupStats per task. Absent (""): a single-role group, as before this field.
    agent: str = ""
    n: int
    reward_mean: float
    reward_std: float
    zero_variance: Literal["easy", "hard", "none"]
    version: int  # trainer version of the newest token in the group
    # Whether the group left the post-rollout stage for groups.<policy>: False when the
    # assembler (incomplete) or a later post-rollout policy (staleness, dynamic sampling)
    # dropped it. Written by the post-rollout stage; read by the gate, which accounts a group
    # from this one record. Absent (records from before this field): taken as kept, the safe
    # reading for the gate (the group keeps its slot, so the staleness bound still holds).
    kept: bool = True


class TrajRef(msgspec.Struct, array_like=True):
    """Where one trajectory record lies on the bus, and what the policies after the assembler
    need of it without fetching it. Written by the assembler (from the record it consumed);
    read by the batch-stage policies and, to fetch the record, the trainer."""

    id: str
    topic: str
    partition: int
    offset: int
    sample_index: int = 0
    reward: float = 0.0


def _one_form(kind: str, gid: str, refs: list[TrajRef], trajectories: list[Trajectory]) -> None:
    if refs and trajectories:
        raise SchemaError(f"{kind} {gid!r} has both refs and trajectories; a group carries "
                          "references (the pipeline) or copies (small producer-made batches)")


class Group(msgspec.Struct, kw_only=True):
    """The whole group of trajectories of one (task, attempt) inside a batch: references to
    the records on the bus (``refs``; the trainer fetches them) or, for small batches made
    without a bus position (SFT demonstrations, benches), copies (``trajectories``). The
    trainer fills ``trajectories`` from ``refs`` before a step."""

    group_id: str
    task_id: str
    refs: list[TrajRef] = []
    trajectories: list[Trajectory] = []
    replayed: bool = False  # true when drawn from the replay buffer

    def __post_init__(self) -> None:
        _one_form("group", self.group_id, self.refs, self.trajectories)

    def rewards(self) -> list[float]:
        return [t.reward for t in (self.refs or self.trajectories)]

    def ids(self) -> list[str]:
        return [t.id for t in (self.refs or self.trajectories)]


class TrajectoryGroup(Record, tag="TrajectoryGroup", kw_only=True):
    """A finished group after post-rollout policies. Key: ``group_id``. Assembler → batcher.

    ``refs`` point at the trajectory records on ``trajectories`` (what the assembler writes
    when it runs on the bus); ``trajectories`` holds copies instead where there is no bus
    position (the assembler run as a pure function). ``version`` is the oldest policy version
    of any generated token in the group (what the staleness rules compare against the
    trainer's version); -1 if no token was generated.

    A group is one (policy, agent, group id): ``agent`` is the role its trajectories played
    (``Trajectory.agent``; "" for a single-role workflow), so a policy playing two roles in
    a task's episodes has two groups with the same ``group_id``, each normalised on its own.
    ``version_vector`` is, for every policy in the members' version vectors, the oldest
    version any member was produced under (what the staleness filter compares against that
    policy's trainer); absent ({}): no member recorded one (older records).
    """

    group_id: str
    task_id: str
    policy: str = "default"
    agent: str = ""
    refs: list[TrajRef] = []
    trajectories: list[Trajectory] = []
    reward_mean: float
    reward_std: float
    version: int
    version_vector: dict[str, int] = {}
    replayed: bool = False
    created_at: float = msgspec.field(default_factory=time.time)

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_form("group", self.group_id, self.refs, self.trajectories)

    def rewards(self) -> list[float]:
        return [t.reward for t in (self.refs or self.trajectories)]

    def ids(self) -> list[str]:
        return [t.id for t in (self.refs or self.trajectories)]


class Batch(Record, tag="Batch", kw_only=True):
    """A training batch of whole groups for one policy. Key: ``policy``. Batcher → trainer."""

    id: str
    policy: str
    seq: int  # batch sequence number within the policy, from 0
    groups: list[Group]  # by reference from the batcher; the trainer fetches the records
    created_at: float = msgspec.field(default_factory=time.time)


class TensorEntry(msgspec.Struct, kw_only=True):
    """One tensor of a weight version: where its bytes are and how to check them."""

    name: str
    shape: list[int]
    dtype: str  # "bfloat16", "float16", "float32"
    uri: str  # blob path relative to the weight store
    offset: int = 0  # byte range inside the blob
    length: int = 0
    digest: str = ""  # hex digest of the tensor's bytes after applying
    changed: int = -1  # delta only: elements changed; -1: not counted / full
    base_digest: str = ""  # delta only: digest of the base tensor it applies to; "": unknown


class WeightManifest(Record, tag="WeightManifest", kw_only=True):
    """The commit marker of a weight version. Key: ``policy``. Trainer → rollout workers."""

    policy: str
    version: int
    base_version: int | None = None  # delta: the version it applies to; full: absent
    kind: Literal["full", "delta"]
    codec: str
    tensors: list[TensorEntry]
    total_bytes: int  # bytes of blobs to fetch for this version
    full_bytes: int  # bytes of a dense snapshot of the same tensors
    blob_digest: str = ""  # digest of the whole blob's bytes (mirrors check it); "": unknown
    created_at: float = msgspec.field(default_factory=time.time)


class Metric(Record, tag="Metric", kw_only=True):
    """A heartbeat and metric snapshot of one process. Key: ``component``. Everyone → reporter."""

    component: str  # unique id of the process, e.g. "rollout-3f2a"
    role: str  # "rollout", "trainer", "policy", "producer", ...
    host: str
    pid: int
    ts: float = msgspec.field(default_factory=time.time)
    status: Literal["starting", "running", "draining", "stopped", "failed"] = "running"
    counters: dict[str, float] = {}  # monotonically increasing since process start
    gauges: dict[str, float] = {}  # current values


class WorkerStatus(msgspec.Struct, kw_only=True):
    """One rollout process as the reporter sees it (from its heartbeats on ``metrics``)."""

    component: str
    host: str
    status: str  # the process's own: running, draining, stopped, failed
    episodes_per_s: float  # episodes finished per second over the window
    last_seen: float  # time.time() of its newest heartbeat
    healthy: bool = True  # heartbeating within the reporter's timeout and not failed
    utilization: float = -1.0  # mean inflight / max_inflight over the window; -1: unknown


class PolicyLoad(msgspec.Struct, kw_only=True):
    """One policy's trainer over a report's window."""

    policy: str
    wait_ratio: float  # share of the window its trainer waited for a batch (0 with no data)
    trainer_step: int  # its trainer's newest step (its weight version)
    produced: int  # trajectories of this policy produced by rollout in the window
    consumed: int  # trajectories its trainer trained on in the window
    steps: int = 0  # trainer steps in the window


class LoadReport(Record, tag="LoadReport", kw_only=True):
    """The reporter's view of a window (DESIGN.md §9). Key: run. Reporter → scaler, humans.

    ``wait_ratio``, ``produced`` and ``consumed`` are over every policy (the largest wait,
    the sums); ``policies`` has each one's own. ``tasks_lag`` is the raw backlog of the
    rollout group on ``tasks`` (what KEDA would scale on); ``useful_lag`` is the part of it
    that can still be trained on when produced (see :mod:`astraflow.policies.reporter`)."""

    run: str
    seq: int = 0  # the reporter's report number (restarts from its checkpoint's)
    window_start: float
    window_end: float
    trainer_step: int  # the newest step of any policy's trainer
    wait_ratio: float  # fraction of the window the trainer waited for input (the largest)
    produced: int  # trajectories produced in the window
    consumed: int  # trajectories trained on in the window
    policies: list[PolicyLoad] = []
    workers: list[WorkerStatus] = []
    current_workers: int  # rollout processes alive and healthy
    target_workers: int = -1  # a suggestion; -1: none (the scaler decides)
    tasks_lag: int = 0  # groups released on ``tasks`` the rollout group has not committed
    ready: int = 0  # groups produced and not yet trained on (every policy's, in groups)
    horizon: int = 0  # groups that can be ahead of the trainer and still be fresh: (k+1)·B
    useful_lag: int = 0  # min(tasks_lag, max(0, horizon - ready))
    utilization: float = -1.0  # busy share of the healthy workers' episode slots; -1: unknown
    reason: str = ""


class DeadLetter(Record, tag="DeadLetter", kw_only=True):
    """A record a consumer could not decode or process. Key: the original key. Any → dlq.

    Written by :func:`astraflow.core.stream.dead_letter`, which bounds it so that a letter
    always fits the bus even when the bad record was close to the size limit: ``value`` is
    the record's first bytes (all of it when short), ``headers`` and ``error`` are cut too.
    """

    origin: str  # "topic[partition]@offset"
    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes  # the bad record's value, or its first bytes (see value_size)
    # the whole value's length and sha256 (hex); absent (-1, ""): ``value`` is whole (older
    # letters)
    value_size: int = -1
    value_digest: str = ""
    headers: list[tuple[str, bytes]] = []
    error: str
    error_type: str
    group: str = ""  # consumer group that failed on it
    component: str = ""
    ts: float = msgspec.field(default_factory=time.time)


class GatewayChoice(msgspec.Struct, kw_only=True):
    """One sampled completion of a gateway call (a call with ``n`` > 1 has several). Arrays
    align per generated token: ``token_ids`` <i4, ``logprobs`` <f4 (behaviour logprobs),
    ``versions`` <i4 (the policy version of the weights that produced each token)."""

    token_ids: bytes
    logprobs: bytes
    versions: bytes
    finish_reason: Literal["stop", "length"] = "stop"  # the engine's
    # trailing tokens that the text returned to the client leaves out (an EOS token, a stop
    # string trimmed): a next turn's rendered prompt may lack them and still continue this one
    hidden: int = 0


class GatewayCall(Record, tag="GatewayCall", kw_only=True):
    """One event of an agent-gateway session (``astraflow serve``, :mod:`astraflow.gateway`).
    Key: ``session_id`` (a session's events stay in order on one partition). Written by the
    gateway, flushed before it answers the HTTP request; read by a restarted gateway, which
    rebuilds its open sessions from them, and by whoever audits what was served.

    ``kind``: ``open`` (the session's metadata), ``call`` (a completed chat or completion
    call: its exact tokens), ``reward``, ``end``, and ``done`` (its Trajectory records were
    produced; the session is closed). Fields a kind does not use keep their defaults.
    """

    session_id: str
    seq: int  # the event's number within its session, from 0, in produce order
    kind: Literal["open", "call", "reward", "end", "done"]
    policy: str = ""  # call: the policy that generated
    # open: where the session's trajectories go (defaults: a group of one named after it)
    task_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    group_size: int = 1
    agent: str = ""
    metadata: dict[str, str] = {}
    # call, reward, end: the client's Idempotency-Key, scoped by route ("chat:KEY",
    # "completions:KEY", "reward:KEY", "end:KEY"); "": none
    call_id: str = ""
    route: Literal["", "chat", "completions"] = ""
    segment: int = 0  # the trajectory (per policy) this call belongs to
    parent: int = -1  # seq of the call whose prompt + completion this one's prompt extends
    parent_choice: int = 0  # which of the parent's choices it extends
    # the prompt tokens after the parent's prompt + completion (the whole prompt when parent
    # is -1), <i4; and the span role they get in the trajectory ("prompt", "tool", "user", ...)
    prompt_ids: bytes = b""
    prompt_role: str = "prompt"
    prompt_len: int = 0  # tokens of the whole prompt
    n_messages: int = 0  # chat: messages in the request
    drift: bool = False  # the request's history did not extend the recorded tokens
    # The client's view of the conversation (what its next turns' renderings extend) where it
    # differs from the recorded tokens: ``view_drop``, the parent's trailing hidden tokens
    # the request's rendering leaves out (an EOS the chat template does not write back);
    # ``view_ids`` (<i4), after a drift continued on the recorded tokens, the request as
    # rendered (b"": the view is the parent's view, its completion and ``prompt_ids``)
    view_drop: int = 0
    view_ids: bytes = b""
    choices: list[GatewayChoice] = []
    response: bytes = b""  # the JSON body answered (replayed for a retried Idempotency-Key)
    reward: float = 0.0  # reward
    rewards: dict[str, float] = {}  # reward: named components; absent: only ``reward``
    created_at: float = msgspec.field(default_factory=time.time)


class Claim(Record, tag="Claim", kw_only=True):
    """A claim check: stands on the bus for a record too large for it, whose encoded bytes
    are in the claim store (:mod:`astraflow.core.claims`). Key: the original key. Written by
    any producer whose record is over the bus's message limit; resolved transparently by the
    processor runtime and the trainer's fetch, so handlers see the original record."""

    uri: str  # where the bytes are, relative to the claim store
    schema_of: str  # the claimed record's schema, e.g. "Trajectory"
    size: int  # bytes of the claimed record
    digest: str  # sha256 hex of those bytes


SCHEMAS: dict[str, type[Record]] = {
    cls.schema_name(): cls
    for cls in (Task, Trajectory, GroupStats, TrajectoryGroup, Batch, WeightManifest, Metric,
                LoadReport, DeadLetter, Claim, GatewayCall)
}

AnyRecord = (Task | Trajectory | GroupStats | TrajectoryGroup | Batch | WeightManifest | Metric
             | LoadReport | DeadLetter | Claim | GatewayCall)

R = TypeVar("R", bound=Record)

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    dec = _decoders.get(kind)
    if dec is None:
        dec = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    return dec


def encode(record: Record) -> bytes:
    """Encode a record to msgpack bytes."""
    return _encoder.encode(record)


def schema_header(record: Record | type[Record]) -> tuple[str, bytes]:
    """The ``af-schema`` header value for a record, e.g. ``("af-schema", b"Task/1")``."""
    cls = record if isinstance(record, type) else type(record)
    return SCHEMA_HEADER, f"{cls.schema_name()}/{cls.SCHEMA_VERSION}".encode()


def decode(data: bytes, kind: type[R] | None = None) -> R | AnyRecord:
    """Decode and validate msgpack bytes into a record.

    ``kind`` restricts the accepted type; without it any known schema is accepted. Raises
    :class:`SchemaError` naming the record type and the offending field.
    """
    target: Any = kind if kind is not None else AnyRecord
    try:
        return _decoder(target).decode(data)  # type: ignore[no-any-return]
    except msgspec.ValidationError as e:
        expected = kind.schema_name() if kind is not None else "a known record"
        raise SchemaError(f"invalid {expected}: {e}") from e
    except msgspec.DecodeError as e:
        raise SchemaError(f"not a msgpack record ({e}); expected "
                          f"{kind.schema_name() if kind else 'a known record'}") from e
    except RecursionError:
        # a free-form field (Task.reference) holding arrays or maps nested past the
        # interpreter's recursion limit: a bad record like any other, not a crash of the reader
        raise SchemaError(
            f"invalid {kind.schema_name() if kind else 'a known record'}: a value nests deeper "
            f"than the decoder allows (about {sys.getrecursionlimit()} levels of arrays or maps"
            "; a free-form field such as Task.reference?); flatten it") from None


def decode_many(items: Sequence[bytes], kind: type[R]) -> list[R]:
    return [decode(b, kind) for b in items]  # type: ignore[misc]


def to_builtins(record: Record) -> Any:
    """A JSON-friendly view of a record (bytes as base64), for ``astraflow inspect``."""
    return msgspec.to_builtins(record)
