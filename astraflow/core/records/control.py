"""The records around the data path: weight versions, heartbeats and metrics, load reports,
dead letters and claim checks (see :mod:`astraflow.core.records` for the wire format)."""

from __future__ import annotations

import time
from typing import Literal

import msgspec

from astraflow.core.records.base import Record


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
    #: a part of a sharded publish: rows ``[start, stop)`` along dim 0 of ``shape`` (the full
    #: tensor's), whose bytes, digest and base digest are those of the slice; written by a
    #: rank of a sharded trainer (weights/sharded.py), read by syncers and mirrors.
    #: Absent (empty): the whole tensor, as every manifest before sharded publishing
    rows: list[int] = []


class BlobPart(msgspec.Struct, kw_only=True):
    """One blob of a version published from the shards: each rank writes its own."""

    uri: str  # blob path relative to the weight store
    total_bytes: int  # the blob's size
    blob_digest: str = ""  # digest of its bytes (mirrors check it)


class AdapterSpec(msgspec.Struct, kw_only=True):
    """A LoRA adapter over a base model (``trainer.lora``): how the tensors of a manifest that
    carries it apply. Written by the trainer (:mod:`astraflow.consumers.trainer.lora`); read by
    the rollout engines (:mod:`astraflow.weights.adapter`). Its tensors are peft's adapter
    state dict (``base_model.model.<module>.lora_A.weight`` [r, in], ``...lora_B.weight``
    [out, r]); a module's weight becomes ``W0 + (alpha / r) * B @ A``."""

    type: Literal["lora"] = "lora"
    r: int
    alpha: float
    target_modules: list[str]  # module names as peft resolved them (e.g. q_proj, v_proj)
    base_model: str  # the base model's name (its directory's or the Hub's name_or_path)
    # sha256 of the base's config.json and its safetensors headers and sizes; "": unknown
    base_fingerprint: str = ""


class WeightManifest(Record, tag="WeightManifest", kw_only=True):
    """The publish marker of a weight version. Key: ``policy``. Trainer → rollout workers."""

    policy: str
    version: int
    base_version: int | None = None  # delta: the version it applies to; full: absent
    kind: Literal["full", "delta"]
    codec: str
    tensors: list[TensorEntry]
    total_bytes: int  # bytes of blobs to fetch for this version
    full_bytes: int  # bytes of a dense snapshot of the same tensors
    blob_digest: str = ""  # digest of the whole blob's bytes (mirrors check it); "": unknown
    #: the blobs of a version published from the shards (one per rank that owns rows), each
    #: tensor entry naming its blob by ``uri`` and its slice by ``rows``; ``total_bytes`` is
    #: then their sum and ``blob_digest`` empty. Absent (empty): one blob, as before
    parts: list[BlobPart] = []
    created_at: float = msgspec.field(default_factory=time.time)
    # LoRA: the tensors are an adapter over this base model, not the model; absent: the model
    adapter: AdapterSpec | None = None


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
    """The reporter's view of a window (docs/elastic.md#the-load-report). Key: run.
    Reporter → scaler, humans.

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


class Claim(Record, tag="Claim", kw_only=True):
    """A claim check: stands on the bus for a record too large for it, whose encoded bytes
    are in the claim store (:mod:`astraflow.core.claims`). Key: the original key. Written by
    any producer whose record is over the bus's message limit; resolved transparently by the
    processor runtime and the trainer's fetch, so handlers see the original record."""

    uri: str  # where the bytes are, relative to the claim store
    schema_of: str  # the claimed record's schema, e.g. "Trajectory"
    size: int  # bytes of the claimed record
    digest: str  # sha256 hex of those bytes
