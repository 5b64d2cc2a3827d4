"""Manifests of versions published from the shards: one blob per rank, tensors in row slices.

A sharded publish (:mod:`astraflow.weights.sharded`) lists one blob per rank in ``parts`` and
one tensor entry per slice, with the full ``shape`` and the slice's ``rows``. Readers see each
part as a single-blob manifest through :func:`split_parts`, and a slice through
:func:`part_key`; a manifest without parts is its own only part."""

from __future__ import annotations

from collections import defaultdict

from astraflow.core.records import TensorEntry, WeightManifest


def part_key(t: TensorEntry) -> str:
    """The name a slice's digest goes by: the tensor's name, with ``[start:stop]`` for a part."""
    return f"{t.name}[{t.rows[0]}:{t.rows[1]}]" if t.rows else t.name


def row_shape(t: TensorEntry) -> list[int]:
    """The shape of the bytes ``t`` covers: the full shape, or the slice's for a part."""
    if not t.rows:
        return list(t.shape)
    return [t.rows[1] - t.rows[0], *t.shape[1:]]


def uris_of(m: WeightManifest) -> list[str]:
    """The blobs of ``m``, in the order of its parts (one for a manifest without parts)."""
    if m.parts:
        return [p.uri for p in m.parts]
    return [m.tensors[0].uri] if m.tensors else []


def split_parts(m: WeightManifest) -> list[WeightManifest]:
    """``m`` as single-blob manifests, one per part, each tensor entry with its slice's shape
    and no ``rows`` (so it reads as the header of its blob says); ``[m]`` when it has no parts."""
    if not m.parts:
        return [m]
    by_uri: dict[str, list[TensorEntry]] = defaultdict(list)
    for t in m.tensors:
        by_uri[t.uri].append(TensorEntry(
            name=t.name, shape=row_shape(t), dtype=t.dtype, uri=t.uri, offset=t.offset,
            length=t.length, digest=t.digest, changed=t.changed, base_digest=t.base_digest))
    return [WeightManifest(policy=m.policy, version=m.version, base_version=m.base_version,
                           kind=m.kind, codec=m.codec, tensors=by_uri[p.uri],
                           total_bytes=p.total_bytes, full_bytes=m.full_bytes,
                           blob_digest=p.blob_digest, created_at=m.created_at)
            for p in m.parts]


def parts_problem(m: WeightManifest) -> str | None:
    """Why the parts of ``m`` cannot be acted on (None: they can): every entry names a listed
    blob and lies inside it, each blob is listed once and holds some entry, and the slices of
    each tensor cover its rows exactly once, in order, with one shape and dtype."""
    sizes: dict[str, int] = {}
    for p in m.parts:
        if p.uri in sizes:
            return f"version {m.version}: part {p.uri!r} is listed twice"
        if p.total_bytes <= 0:
            return f"version {m.version}: part {p.uri!r} has {p.total_bytes} bytes"
        sizes[p.uri] = p.total_bytes
    if sum(sizes.values()) != m.total_bytes:
        return (f"version {m.version}: total_bytes {m.total_bytes} is not the sum of its parts' "
                f"{sum(sizes.values())}")
    used: set[str] = set()
    slices: dict[str, list[TensorEntry]] = defaultdict(list)
    for t in m.tensors:
        if t.uri not in sizes:
            return f"tensor {t.name!r}: blob {t.uri!r} is not among the version's parts"
        used.add(t.uri)
        if t.offset < 0 or t.length < 0 or t.offset + t.length > sizes[t.uri]:
            return (f"tensor {t.name!r}: range {t.offset}+{t.length} outside part {t.uri!r} "
                    f"of {sizes[t.uri]} bytes")
        if t.rows and (len(t.rows) != 2 or not t.shape
                       or not 0 <= t.rows[0] < t.rows[1] <= t.shape[0]):
            return f"tensor {t.name!r}: rows {t.rows} are not a slice of shape {t.shape}"
        slices[t.name].append(t)
    if used != set(sizes):
        return f"version {m.version}: parts {sorted(set(sizes) - used)} hold no tensor"
    for name, ts in slices.items():
        if len({(tuple(t.shape), t.dtype) for t in ts}) != 1:
            return f"tensor {name!r}: its parts disagree on shape or dtype"
        if len(ts) == 1 and not ts[0].rows:
            continue
        edges = [0]
        for t in sorted(ts, key=lambda t: t.rows[0] if t.rows else -1):
            if not t.rows or t.rows[0] != edges[-1]:
                return f"tensor {name!r}: its parts do not tile its rows (gap, overlap or whole)"
            edges.append(t.rows[1])
        if edges[-1] != ts[0].shape[0]:
            return f"tensor {name!r}: its parts cover rows 0:{edges[-1]} of {ts[0].shape[0]}"
    return None
