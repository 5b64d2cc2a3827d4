"""Publishing from the shards: every rank of a sharded trainer encodes the rows it owns.

Under FSDP2 every rank calls :meth:`ShardedPublisher.publish` with its :class:`Shard` s (its
rows of each tensor along dim 0) and writes its own blob; rank 0 sends one manifest listing
every rank's blob as a part (:mod:`astraflow.weights.parts`). Publishing is a collective: call
it on every rank, in the same order. A syncer ends with bit-for-bit the weights an unsharded
publisher would give (docs/weights.md).

>>> pub = ShardedPublisher(bus if rank == 0 else None, run="demo", policy="solver",
...                        store=FileStore("/mnt/weights"), rank=rank, world_size=world)
>>> pub.publish(shards_of(model.state_dict(), rank), version=step)"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astraflow.core.bus.types import Bus
from astraflow.core.errors import AstraflowError, WeightIntegrityError
from astraflow.core.records import BlobPart, TensorEntry, WeightManifest, encode
from astraflow.core.stream import Output, send
from astraflow.core.topics import record_key, topic_name
from astraflow.weights.bits import as_bits, blob_digest
from astraflow.weights.blob import CODEC, Bits, EncodedVersion, check_compatible, encode_version
from astraflow.weights.codec import DEFAULT_LEVEL
from astraflow.weights.publisher import ManifestTooLargeError, PublishStats
from astraflow.weights.store import StoreFullError, WeightStore, discard

log = logging.getLogger("astraflow.weights.sharded")

#: every rank's bytes in, the list of all ranks' bytes (in rank order) out
Exchange = Callable[[bytes], list[bytes]]


@dataclass(frozen=True)
class Shard:
    """The rows ``[start, start + len(local))`` along dim 0 of tensor ``name`` of full shape
    ``shape``, as this rank holds them (``local``: a torch tensor or numpy array; may have no
    rows). A tensor that is not sharded (a buffer, a 0-dim tensor) is published by one rank
    as a shard with ``start`` 0 and every row."""

    name: str
    local: Any
    shape: tuple[int, ...]
    start: int = 0

    @property
    def rows(self) -> int:
        return int(self.local.shape[0]) if len(self.shape) else 1

    @property
    def whole(self) -> bool:
        return not self.shape or (self.start == 0 and self.rows == self.shape[0])


def shards_of(state: Mapping[str, Any], rank: int) -> list[Shard]:
    """This rank's shards of a model's ``state_dict()`` under FSDP2: a DTensor sharded on dim
    0 (``Shard(0)``) gives its local rows and their offset; a plain tensor (a buffer) or a
    replicated DTensor is published whole by rank 0 only."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    out = []
    for name, t in state.items():
        if isinstance(t, DTensor):
            if all(isinstance(p, Replicate) for p in t.placements):
                out.append(Shard(name, t.to_local(), tuple(t.shape)) if rank == 0 else
                           Shard(name, t.to_local()[:0], tuple(t.shape)))
                continue
            if len(t.placements) != 1 or t.placements[0] != DShard(0):
                raise AstraflowError(f"tensor {name!r} is placed {t.placements}; sharded "
                                     "publishing reads FSDP2's Shard(0) on a 1-D mesh")
            _shape, offset = compute_local_shape_and_global_offset(
                t.shape, t.device_mesh, t.placements)
            local = t.to_local()
            out.append(Shard(name, local, tuple(t.shape), int(offset[0]) if local.shape[0]
                             else 0))
        else:
            shape = tuple(t.shape)
            out.append(Shard(name, t if rank == 0 or not shape else t[:0], shape))
            if rank != 0 and not shape:
                out.pop()  # a 0-dim buffer: rank 0's alone
    return out


def torch_exchange(group: Any = None) -> Exchange:
    """:data:`Exchange` over ``torch.distributed.all_gather`` of uint8 tensors (a length, then
    the padded bytes), on the device the process group's backend wants (CPU for gloo)."""
    import torch
    import torch.distributed as dist

    def device() -> torch.device:
        if dist.get_backend(group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def exchange(data: bytes) -> list[bytes]:
        dev = device()
        world = dist.get_world_size(group)
        size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
        dist.all_gather(sizes, size, group=group)
        n = max(int(s.item()) for s in sizes)
        mine = torch.zeros(n, dtype=torch.uint8, device=dev)
        if data:
            mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
        alls = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(world)]
        dist.all_gather(alls, mine, group=group)
        return [a[:int(s.item())].cpu().numpy().tobytes() for a, s in zip(alls, sizes,
                                                                           strict=True)]

    return exchange


def _rows_of(where: tuple[tuple[int, ...], int], local_shape: list[int]) -> dict[str, Any]:
    shape, start = where
    return {"shape": list(shape), "rows": [] if start < 0 else [start, start + local_shape[0]]}


class ShardedPublisher:
    """One rank's side of publishing a sharded model; rank 0 also sends the manifests."""

    sharded = True  # the trainer hands it each rank's own shards (trainer/sharding.py)

    def __init__(self, bus: Bus | None, *, run: str, policy: str, store: WeightStore,
                 rank: int, world_size: int, exchange: Exchange | None = None,
                 full_every: int = 20, max_delta_fraction: float = 0.5,
                 dtype: str | None = "bfloat16", level: int = DEFAULT_LEVEL,
                 client_id: str = "") -> None:
        if full_every < 1:
            raise AstraflowError(f"full_every must be >= 1, got {full_every}")
        if rank == 0 and bus is None:
            raise AstraflowError("rank 0 sends the manifests: give it the bus")
        self.policy, self.store, self.rank, self.world_size = policy, store, rank, world_size
        self.full_every = full_every
        self.max_delta_fraction = max_delta_fraction
        self.dtype = dtype
        self.level = level
        self.topic = topic_name(run, "weights", policy)
        self.stats = PublishStats()
        self.last_manifests: list[WeightManifest] = []
        self._exchange = exchange or torch_exchange()
        self._bus = bus
        self._producer = None
        if bus is not None and rank == 0:
            bus.create_topics({self.topic: 1})
            self._producer = bus.producer(client_id=client_id or f"weights-publisher-{policy}")
        self._base: Bits | None = None
        self._base_rows: dict[str, tuple[tuple[int, ...], int]] = {}
        self._base_version: int | None = None
        self._base_digests: dict[str, str] = {}
        self._last_full: int | None = None
        self._last_version: int | None = None

    def publish(self, shards: Sequence[Shard] | Mapping[str, Any], version: int) -> None:
        """Publish this rank's ``shards`` of ``version`` (or a model's FSDP2 ``state_dict()``,
        read by :func:`shards_of`, so the trainer's loop calls this as it calls
        :meth:`Publisher.publish`). Every rank calls it, with the same versions in the same
        order; it returns once the manifest is on the bus (rank 0) or the rank's blob is
        stored and described to rank 0 (the others)."""
        if isinstance(shards, Mapping):
            shards = shards_of(shards, self.rank)
        if self._last_version is not None and version <= self._last_version:
            raise AstraflowError(f"version {version} is not newer than the last published "
                                 f"version {self._last_version}; versions must increase")
        self._last_version = version
        bits: dict[str, tuple[str, Any]] = {}
        rows: dict[str, tuple[tuple[int, ...], int]] = {}
        for s in shards:
            if s.rows:
                bits[s.name] = as_bits(s.local, name=s.name, copy=True, dtype=self.dtype)
                rows[s.name] = (tuple(s.shape), -1 if s.whole else s.start)
        base = self._base
        if base is not None:
            try:
                check_compatible(bits, base)
                if rows != self._base_rows:
                    raise WeightIntegrityError("the rows this rank owns changed")
            except WeightIntegrityError as e:
                log.info("rank=%d tensor set changed at version=%d (%s): full snapshot",
                         self.rank, version, e)
                base = None
        dense = sum(b.nbytes for _d, b in bits.values())
        delta = None
        if base is not None and bits:
            delta = encode_version(bits, version=version, base=base,
                                   base_version=self._base_version,
                                   base_digests=self._base_digests, level=self.level)
        plan = [json.loads(b) for b in self._exchange(json.dumps({
            "base": base is not None, "dense": dense,
            "delta": len(delta.blob) if delta is not None else 0}).encode())]
        # the unsharded publisher's rules, on the sums over the ranks
        with_base = all(p["base"] for p in plan)
        full = not with_base or self._last_full is None or \
            version - self._last_full >= self.full_every
        total_dense = sum(p["dense"] for p in plan)
        use_delta = with_base and \
            sum(p["delta"] for p in plan) <= self.max_delta_fraction * total_dense
        full = full or not use_delta  # a delta too large: a full instead
        kinds = (["delta"] if use_delta else []) + (["full"] if full else [])
        encs: list[EncodedVersion] = [delta] if use_delta and delta is not None else []
        if full and bits:
            encs.append(encode_version(bits, version=version, level=self.level))
        described, stored = self._store(encs, version, rows)
        everyone = [json.loads(b) for b in self._exchange(json.dumps(
            {"stored": stored, "parts": described}).encode())]
        if not all(e["stored"] for e in everyone):
            self.stats.skipped_full += 1
            log.error("version=%d not published: a rank's store was full", version)
            discard(self.store, [d["uri"] for d in described], f"unpublished version={version}")
            return
        if self._producer is not None:
            self._send(everyone, kinds, version, total_dense)
        self._base, self._base_rows, self._base_version = bits, rows, version
        self._base_digests = encs[0].digests if encs else {}
        if full:
            self._last_full = version
            self.stats.fulls += 1
        self.stats.deltas += len(kinds) - int(full)
        self.stats.versions += 1
        self.stats.dense_bytes += dense

    def _store(self, encs: list[EncodedVersion], version: int,
               rows: dict[str, tuple[tuple[int, ...], int]]) -> tuple[list[dict[str, Any]], bool]:
        """Write this rank's blobs; their descriptions for rank 0, and whether all were stored."""
        token = uuid.uuid4().hex[:8]
        out = []
        try:
            for enc in encs:
                h = enc.header
                uri = (f"{self.policy}/v{version:010d}.{h.kind}.{token}."
                       f"r{self.rank:05d}.afw")
                self.store.put(uri, enc.blob)
                self.stats.bytes_written += len(enc.blob)
                out.append({"kind": h.kind, "uri": uri, "total_bytes": len(enc.blob),
                            "blob_digest": blob_digest(enc.blob), "tensors": [
                                {"name": t.name, "dtype": t.dtype,
                                 "rows": _rows_of(rows[t.name], t.shape),
                                 "offset": enc.payload_start + t.offset, "length": t.length,
                                 "digest": t.digest, "changed": t.changed,
                                 "base_digest": t.base_digest} for t in h.tensors]})
        except StoreFullError as e:
            log.error("rank=%d version=%d: %s", self.rank, version, e)
            discard(self.store, [str(d["uri"]) for d in out], f"unpublished version={version}")
            return [], False
        return out, True

    def _send(self, everyone: list[dict[str, Any]], kinds: list[str], version: int,
              dense: int) -> None:
        manifests = []
        for kind in kinds:
            parts, tensors = [], []
            for e in everyone:
                for p in e["parts"]:
                    if p["kind"] != kind:
                        continue
                    parts.append(BlobPart(uri=p["uri"], total_bytes=p["total_bytes"],
                                          blob_digest=p["blob_digest"]))
                    tensors += [TensorEntry(
                        name=t["name"], shape=t["rows"]["shape"], dtype=t["dtype"],
                        uri=p["uri"], offset=t["offset"], length=t["length"],
                        digest=t["digest"], changed=t["changed"],
                        base_digest=t["base_digest"], rows=t["rows"]["rows"])
                        for t in p["tensors"]]
            m = WeightManifest(
                policy=self.policy, version=version, kind=kind,  # type: ignore[arg-type]
                base_version=self._base_version if kind == "delta" else None, codec=CODEC,
                tensors=tensors, total_bytes=sum(p.total_bytes for p in parts),
                full_bytes=dense, parts=parts)
            size = len(encode(m)) + len(self.topic) + 256
            assert self._bus is not None
            if size > self._bus.max_message_bytes:
                raise ManifestTooLargeError(
                    f"the manifest of {self.policy} v{version} ({len(tensors)} tensor slices) "
                    f"is ~{size:,} bytes, over the bus's max_message_bytes="
                    f"{self._bus.max_message_bytes:,}; raise bus.max_message_bytes")
            manifests.append(m)
        assert self._producer is not None
        for m in manifests:
            send(self._producer, Output(self.topic, m, record_key("weights", m)))
        self._producer.flush()
        self.last_manifests = manifests
        log.info("published policy=%s version=%d from %d ranks blobs=%s bytes=%d dense=%d",
                 self.policy, version, self.world_size, kinds,
                 sum(m.total_bytes for m in manifests), dense)

    # the rest of Publisher's interface, as the trainer's loop uses it
    def flush(self, timeout: float | None = None) -> None:
        """Nothing to wait for: :meth:`publish` returns when its version is out."""

    def resume(self, tensors: Mapping[str, Any], version: int, *,
               last_full: int | None = None) -> bool:
        """Not continued across a restart yet: the next version is a full (every rank says
        False, so they agree)."""
        self._last_version = version
        return False

    def maybe_refresh(self) -> bool:
        """No refresh of a starved trainer's newest version yet (it would be a collective that
        every rank must enter at the same point)."""
        return False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
