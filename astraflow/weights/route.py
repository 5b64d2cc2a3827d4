"""Route planning: from the weights a worker holds to the newest version, for the fewest bytes.

:func:`plan_route` is a pure function of the manifests seen on ``weights.<policy>``. Its nodes
are weight states (a version and its tensor digests): a full manifest is an edge from anywhere,
a delta an edge from the exact state its base digests name. The cheapest path wins; ties go to
fewer blobs. Manifests without base digests fall back to version numbers
(docs/weights.md#syncer)."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from astraflow.core.records import WeightManifest
from astraflow.weights.parts import part_key

#: a weight state: a key of its (tensor name, digest) pairs; None when some digest is unknown
State = str | None
Node = tuple[int, State]  # (version, state)


@dataclass(frozen=True)
class Route:
    """Manifests to apply in order, and the bytes they cost to fetch."""

    steps: list[WeightManifest] = field(default_factory=list)
    bytes: int = 0

    @property
    def version(self) -> int | None:
        return self.steps[-1].version if self.steps else None


def state_of(digests: Mapping[str, str] | None) -> State:
    """The state of a version whose tensors have these digests (None: not all known)."""
    if not digests or not all(digests.values()):
        return None
    h = hashlib.sha256()
    for name, dig in sorted(digests.items()):
        h.update(f"{len(name)}:{name}={dig};".encode())
    return h.hexdigest()


def after_state(m: WeightManifest) -> State:
    """The state a worker holds after applying ``m``."""
    return state_of({part_key(t): t.digest for t in m.tensors})


def base_state(m: WeightManifest) -> State:
    """The state a delta applies to (None: a full, or a manifest without base digests)."""
    if m.kind != "delta":
        return None
    return state_of({part_key(t): t.base_digest for t in m.tensors})


def latest_by_version(manifests: Iterable[WeightManifest]
                      ) -> dict[int, dict[str, WeightManifest]]:
    """version → kind → manifest; a later manifest of the same version and kind replaces an
    earlier one (a trainer that restarted and published that version again)."""
    out: dict[int, dict[str, WeightManifest]] = {}
    for m in manifests:
        out.setdefault(m.version, {})[m.kind] = m
    return out


def _edges(manifests: Iterable[WeightManifest], bad: set[str]) -> list[tuple[int, WeightManifest]]:
    """The usable manifests in version order, each with its position in the input. Of two
    manifests of the same version and kind between the same states, the later one is kept (a
    republished version); manifests between different states are different edges."""
    kept: dict[tuple[int, str, State, State], tuple[int, WeightManifest]] = {}
    for i, m in enumerate(manifests):
        if {t.uri for t in m.tensors} & bad:
            continue
        kept[(m.version, m.kind, base_state(m), after_state(m))] = (i, m)
    return sorted(kept.values(), key=lambda e: (e[1].version, e[0]))


def plan_route(manifests: Iterable[WeightManifest], current: int | None, *,
               current_digests: Mapping[str, str] | None = None, target: int | None = None,
               exclude: Iterable[str] = ()) -> Route | None:
    """The cheapest route from what the worker holds — version ``current`` (None: nothing
    usable) whose tensors have ``current_digests`` (None: not known) — to ``target`` (default:
    the newest version that has a route), skipping manifests whose blobs are in ``exclude``.
    Of two reachable states of the newest version, the one published later wins (the restarted
    trainer's). None when no version newer than ``current`` is reachable."""
    edges = _edges(manifests, set(exclude))
    # node → (bytes, blobs, manifest, previous node, position of the manifest in the input)
    best: dict[Node, tuple[int, int, WeightManifest | None, Node | None, int]] = {}
    by_state: dict[str, list[Node]] = defaultdict(list)  # indexes of the nodes in best
    by_version: dict[int, list[Node]] = defaultdict(list)
    start: Node | None = None

    def add(node: Node, entry: tuple[int, int, WeightManifest | None, Node | None, int]) -> None:
        old = best.get(node)
        if old is None:
            if node[1] is not None:
                by_state[node[1]].append(node)
            by_version[node[0]].append(node)
        elif (entry[0], entry[1]) >= (old[0], old[1]):
            return
        best[node] = entry

    if current is not None:
        start = (current, state_of(current_digests))
        add(start, (0, 0, None, None, -1))
    for pos, m in edges:
        if current is not None and m.version <= current:
            continue
        cands: list[tuple[int, int, WeightManifest | None, Node | None, int]] = []
        if m.kind == "full":
            cands.append((m.total_bytes, 1, m, None, pos))
        elif m.base_version is not None and m.base_version < m.version:
            want = base_state(m)
            # both states known: the bytes decide; else (a legacy manifest, or a worker that
            # does not know its digests) the version number
            froms = [n for n in by_state.get(want, ()) if n[0] < m.version] if want else []
            froms += [n for n in by_version.get(m.base_version, ())
                      if want is None or n[1] is None]
            for node in froms:
                b, n, _m, _p, _i = best[node]
                cands.append((b + m.total_bytes, n + 1, m, node, pos))
        if cands:
            add((m.version, after_state(m)), min(cands, key=lambda c: (c[0], c[1])))
    reachable = [n for n in best if n != start and (current is None or n[0] > current)]
    if target is not None:
        reachable = [n for n in reachable if n[0] == target]
    if not reachable:
        return None
    newest = max(n[0] for n in reachable)
    # the newest version's state published last; then the cheapest way there
    end = max((n for n in reachable if n[0] == newest), key=lambda n: (best[n][4], -best[n][0]))
    total = best[end][0]
    steps: list[WeightManifest] = []
    at: Node | None = end
    while at is not None and at != start:
        _b, _n, step, prev, _i = best[at]
        assert step is not None
        steps.append(step)
        at = prev
    steps.reverse()
    return Route(steps, total)
