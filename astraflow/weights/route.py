"""Route planning: from the version a worker holds to the newest, for the fewest bytes.

A pure function of the manifests seen on ``weights.<policy>``. Versions are nodes; a full
manifest is an edge from anywhere (including from nothing), a delta manifest an edge from its
base version. The cheapest path wins: usually the chain of deltas from where the worker is,
or the newest full snapshot plus the deltas after it; ties go to fewer blobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from astraflow.core.records import WeightManifest


@dataclass(frozen=True)
class Route:
    """Manifests to apply in order, and the bytes they cost to fetch."""

    steps: list[WeightManifest] = field(default_factory=list)
    bytes: int = 0

    @property
    def version(self) -> int | None:
        return self.steps[-1].version if self.steps else None


def latest_by_version(manifests: Iterable[WeightManifest]
                      ) -> dict[int, dict[str, WeightManifest]]:
    """version → kind → manifest; a later manifest of the same version and kind replaces an
    earlier one (a trainer that restarted and published that version again)."""
    out: dict[int, dict[str, WeightManifest]] = {}
    for m in manifests:
        out.setdefault(m.version, {})[m.kind] = m
    return out


def _blobs(m: WeightManifest) -> set[str]:
    return {t.uri for t in m.tensors}


def plan_route(manifests: Iterable[WeightManifest], current: int | None, *,
               target: int | None = None, exclude: Iterable[str] = ()) -> Route | None:
    """The cheapest route from ``current`` (None: the worker holds nothing usable) to
    ``target`` (default: the newest version that has a route), skipping manifests whose blobs
    are in ``exclude``. None when no version newer than ``current`` is reachable."""
    bad = set(exclude)
    by_version = latest_by_version(manifests)
    best: dict[int, tuple[int, int, WeightManifest | None, int | None]] = {}
    if current is not None:
        best[current] = (0, 0, None, None)  # (bytes, steps, manifest, previous version)
    for v in sorted(by_version):
        if v == current:
            continue
        kinds = by_version[v]
        cands: list[tuple[int, int, WeightManifest | None, int | None]] = []
        full = kinds.get("full")
        if full is not None and not (_blobs(full) & bad):
            cands.append((full.total_bytes, 1, full, None))
        delta = kinds.get("delta")
        if (delta is not None and not (_blobs(delta) & bad) and delta.base_version in best
                and delta.base_version is not None and delta.base_version < v):
            b, s, _m, _p = best[delta.base_version]
            cands.append((b + delta.total_bytes, s + 1, delta, delta.base_version))
        if cands:
            best[v] = min(cands, key=lambda c: (c[0], c[1]))
    reachable = [v for v in best if current is None or v > current]
    if target is not None:
        reachable = [v for v in reachable if v == target]
    if not reachable:
        return None
    at: int | None = max(reachable)
    total = best[max(reachable)][0]
    steps: list[WeightManifest] = []
    while at is not None and at != current:
        _b, _s, m, prev = best[at]
        assert m is not None
        steps.append(m)
        at = prev
    steps.reverse()
    return Route(steps, total)
