"""Reading ``weights.<policy>``: what the syncer, the mirror, the publisher (its newest full
version) and the policy stages (:mod:`astraflow.policies.trust`) share.

:func:`read_new` reads every manifest published so far with a group-less reader, and
:func:`decode_manifest` turns a record into a manifest of the expected policy or says why not.
Anyone who can produce to the topic can write a manifest, so :class:`ManifestBook` checks each
before it is acted on: :func:`manifest_problem` refuses a malformed one, and of two manifests
naming the same blob the first one read stands."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from astraflow.core.bus.types import Bus, Message, Reader
from astraflow.core.errors import SchemaError, WeightIntegrityError, WeightStoreError
from astraflow.core.records import WeightManifest, decode
from astraflow.weights.bits import DTYPES
from astraflow.weights.blob import CODEC
from astraflow.weights.parts import part_key, parts_problem, uris_of
from astraflow.weights.store import check_path

log = logging.getLogger("astraflow.weights.follow")


def read_new(bus: Bus, reader: Reader, topic: str, take: Callable[[Message], None], *,
             timeout: float = 0.0, max_records: int | None = None) -> int:
    """Hand every record of ``topic`` that ``reader`` has not read yet, up to the end offsets
    now, to ``take``; when there is none, wait up to ``timeout`` seconds for the first new one.
    Stops early after ``max_records``. Returns how many records were read."""
    ends = bus.describe_topic(topic).end_offsets
    behind = {p: end for p, end in ends.items() if end > reader.position(p)}
    deadline = time.monotonic() + timeout
    got = 0
    while max_records is None or got < max_records:
        if behind:  # records exist that we have not read: wait for them (bounded)
            wait = max(1.0, deadline - time.monotonic())
        else:  # caught up: wait only for the first new record
            wait = 0.0 if got else max(0.0, deadline - time.monotonic())
        n = 500 if max_records is None else min(500, max_records - got)
        msgs = reader.consume(n, wait)
        if not msgs:
            break
        for msg in msgs:
            if behind.get(msg.partition, -1) <= msg.offset + 1:
                behind.pop(msg.partition, None)
            take(msg)
        got += len(msgs)
    return got


def decode_manifest(msg: Message, policy: str) -> WeightManifest | None:
    """The manifest in ``msg`` when it is one of ``policy``'s; None (logged) when the record is
    not a manifest or belongs to another policy."""
    try:
        m = cast(WeightManifest, decode(msg.value, WeightManifest))
    except SchemaError as e:
        log.warning("skipped record origin=%s error=%s", msg.origin, e)
        return None
    if m.policy != policy:
        log.warning("skipped manifest of policy=%s on %s's topic origin=%s", m.policy, policy,
                    msg.origin)
        return None
    return m


class BadManifestError(WeightIntegrityError):
    """A manifest refused before anything was fetched for it: malformed, or conflicting with
    the manifest already read for its blob."""


def manifest_problem(m: WeightManifest) -> str | None:
    """Why ``m`` cannot be acted on (None: it can). Structure only: whether its blob exists and
    holds what it says is for the blob's own checks."""
    if not m.tensors:
        return f"version {m.version} lists no tensors"
    uris = {t.uri for t in m.tensors}
    if len(uris) != 1 and not m.parts:
        return f"version {m.version} spans {len(uris)} blobs but lists no parts"
    for uri in uris | {p.uri for p in m.parts}:
        try:
            check_path(uri)
        except WeightStoreError as e:
            return str(e)
    if m.codec != CODEC:
        return f"codec {m.codec!r}; this build reads {CODEC!r}"
    if m.version < 0:
        return f"version {m.version} is negative"
    if m.kind == "full" and m.base_version is not None:
        return f"full {m.version} names a base version ({m.base_version})"
    if m.kind == "delta" and (m.base_version is None or not 0 <= m.base_version < m.version):
        return f"delta {m.version} has base version {m.base_version}; expected 0 <= base < version"
    if m.total_bytes <= 0 or m.full_bytes < 0:
        return f"total_bytes {m.total_bytes} / full_bytes {m.full_bytes}"
    if m.parts and (problem := parts_problem(m)) is not None:
        return problem
    names: set[str] = set()
    for t in m.tensors:
        if part_key(t) in names:
            return f"tensor {part_key(t)!r} appears twice"
        names.add(part_key(t))
        if t.dtype not in DTYPES:
            return f"tensor {t.name!r}: dtype {t.dtype!r}; valid: {', '.join(DTYPES)}"
        if any(d < 0 for d in t.shape):
            return f"tensor {t.name!r}: shape {t.shape}"
        if not m.parts and (t.offset < 0 or t.length < 0
                            or t.offset + t.length > m.total_bytes):
            return (f"tensor {t.name!r}: range {t.offset}+{t.length} outside the blob's "
                    f"{m.total_bytes} bytes")
    return None


def _claims(m: WeightManifest) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__struct_fields__ if f != "created_at"}


class ManifestBook:
    """The manifests of one policy read so far, by blob. :meth:`admit` says whether a manifest
    is new (act on it) or a repeat of one already read (ignore it), and raises
    :class:`BadManifestError` for one that is malformed or names a blob whose first manifest
    says something else (other version, kind, digests or sizes): the first one stands."""

    def __init__(self) -> None:
        self._by_uri: dict[str, WeightManifest] = {}

    def admit(self, m: WeightManifest) -> bool:
        problem = manifest_problem(m)
        if problem is not None:
            raise BadManifestError(f"refused manifest: {problem}")
        uri = " ".join(uris_of(m))
        first = self._by_uri.get(uri)
        if first is None:
            self._by_uri[uri] = m
            return True
        if _claims(first) == _claims(m):
            return False
        raise BadManifestError(
            f"refused manifest of version {m.version} ({m.kind}): blob {uri!r} already has a "
            f"manifest (version {first.version}, {first.kind}) that says otherwise, and the "
            "first one read stands")
