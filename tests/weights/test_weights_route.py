"""Route planning is a pure function of the manifests: cheapest bytes, then fewest blobs."""

from __future__ import annotations

from astraflow.core.records import TensorEntry, WeightManifest
from astraflow.weights.route import plan_route


def m(version: int, kind: str, size: int, base: int | None = None, uri: str = "") -> WeightManifest:
    uri = uri or f"p/v{version}.{kind}.afw"
    return WeightManifest(policy="p", version=version, base_version=base,
                          kind=kind,  # type: ignore[arg-type]
                          codec="afw/1", total_bytes=size, full_bytes=1000,
                          tensors=[TensorEntry(name="w", shape=[1], dtype="bfloat16", uri=uri)])


def published(n: int, every: int = 20, full: int = 1000, delta: int = 10) -> list[WeightManifest]:
    out = [m(0, "full", full)]
    for v in range(1, n):
        out.append(m(v, "delta", delta, v - 1))
        if v % every == 0:
            out.append(m(v, "full", full))
    return out


def steps(route) -> list[tuple[int, str]]:
    return [(s.version, s.kind) for s in route.steps]


def test_from_nothing_takes_newest_full_and_later_deltas() -> None:
    r = plan_route(published(45), None)
    assert steps(r) == [(40, "full")] + [(v, "delta") for v in range(41, 45)]
    assert r.bytes == 1000 + 4 * 10


def test_one_behind_takes_one_delta() -> None:
    r = plan_route(published(45), 43)
    assert steps(r) == [(44, "delta")] and r.bytes == 10


def test_far_behind_picks_the_cheaper_of_chain_and_full() -> None:
    ms = published(45)
    assert steps(plan_route(ms, 14)) == [(v, "delta") for v in range(15, 45)]  # 300 < 1040
    big = published(45, delta=60)
    assert steps(plan_route(big, 14)) == [(40, "full")] + [(v, "delta") for v in range(41, 45)]


def test_up_to_date_or_nothing_reachable() -> None:
    assert plan_route(published(5), 4) is None
    assert plan_route([m(3, "delta", 10, 2)], None) is None


def test_broken_chain_and_excluded_blobs_route_around() -> None:
    ms = [x for x in published(30) if not (x.version == 25 and x.kind == "delta")]
    # without delta 25 and no full after 20, nothing past 24 can be built
    assert steps(plan_route(ms, 23)) == [(24, "delta")]
    assert steps(plan_route(ms + [m(28, "full", 1000)], 23)) == [(28, "full"), (29, "delta")]
    ms = published(30)
    r = plan_route(ms, None, exclude={"p/v25.delta.afw"})  # healing from nothing
    assert steps(r) == [(20, "full")] + [(v, "delta") for v in range(21, 25)]


def test_newest_reachable_when_the_newest_is_not() -> None:
    ms = published(10) + [m(12, "delta", 10, 11)]  # base 11 never arrived
    assert plan_route(ms, 5).version == 9


def test_republished_version_replaces_the_earlier_manifest() -> None:
    ms = published(3) + [m(2, "delta", 5, 1, uri="p/v2.delta.again.afw")]
    r = plan_route(ms, 1)
    assert r.steps[0].tensors[0].uri == "p/v2.delta.again.afw"


def test_target_version() -> None:
    assert plan_route(published(10), 2, target=5).version == 5


# -- content states: a delta is planned only from the bytes it was made against ---------------

def dm(version: int, kind: str, size: int, after: str, base: str = "",
       base_version: int | None = None, uri: str = "") -> WeightManifest:
    """A manifest whose one tensor has digest ``after`` (and, a delta, base digest ``base``)."""
    uri = uri or f"p/v{version}.{kind}.{after}.afw"
    return WeightManifest(policy="p", version=version, base_version=base_version,
                          kind=kind,  # type: ignore[arg-type]
                          codec="afw/1", total_bytes=size, full_bytes=1000,
                          tensors=[TensorEntry(name="w", shape=[1], dtype="bfloat16", uri=uri,
                                               digest=after, base_digest=base)])


def lineage(tag: str, first: int, last: int, base: str | None = None) -> list[WeightManifest]:
    """Deltas first..last, each against the one before; the first against ``base``."""
    out = []
    prev = base if base is not None else f"{tag}{first - 1}"
    for v in range(first, last + 1):
        out.append(dm(v, "delta", 10, f"{tag}{v}", prev, v - 1))
        prev = f"{tag}{v}"
    return out


def test_a_delta_against_other_bytes_is_never_planned() -> None:
    """A trainer died after publishing 12 and restarted from its checkpoint at 10: its new 11
    and 12 differ from the old ones. A worker holding the old 12 must not take the new 13
    (made against the new 12) even though the version numbers chain: it takes the full."""
    old = [dm(0, "full", 1000, "a0")] + lineage("a", 1, 12, "a0")
    new = lineage("b", 11, 14, "a10") + [dm(14, "full", 1000, "b14")]
    r = plan_route(old + new, 12, current_digests={"w": "a12"})
    assert steps(r) == [(14, "full")]
    # by version numbers alone the new 13 would have looked like the next step
    assert steps(plan_route(old + new, 12)) == [(13, "delta"), (14, "delta")]


def test_a_bit_identical_restart_keeps_the_chain() -> None:
    """On CPU a restarted trainer reproduces its versions bit for bit: the same digests, so a
    worker holding the dead trainer's 12 continues with the restarted trainer's deltas."""
    old = [dm(0, "full", 1000, "a0")] + lineage("a", 1, 12, "a0")
    again = lineage("a", 11, 14)  # the same bytes, published again (new blob names)
    again = [dm(x.version, "delta", 10, x.tensors[0].digest, x.tensors[0].base_digest,
                x.base_version, uri=f"p/v{x.version}.again.afw") for x in again]
    r = plan_route(old + again, 12, current_digests={"w": "a12"})
    assert steps(r) == [(13, "delta"), (14, "delta")] and r.bytes == 20


def test_the_restarted_lineage_wins_at_the_newest_version() -> None:
    """Two different states of version 12 reachable: the one published later is the
    restarted trainer's, the one its next deltas build on."""
    old = [dm(0, "full", 1000, "a0")] + lineage("a", 1, 12, "a0")
    new = lineage("b", 11, 12, "a10")
    r = plan_route(old + new, 10, current_digests={"w": "a10"})
    assert steps(r) == [(11, "delta"), (12, "delta")]
    assert [s.tensors[0].digest for s in r.steps] == ["b11", "b12"]


def test_a_worker_that_does_not_know_its_digests_falls_back_to_versions() -> None:
    ms = [dm(0, "full", 1000, "a0")] + lineage("a", 1, 5, "a0")
    assert steps(plan_route(ms, 3)) == [(4, "delta"), (5, "delta")]
    assert steps(plan_route(ms, 3, current_digests={"w": "a3"})) == [(4, "delta"),
                                                                     (5, "delta")]
    # a worker whose bytes are none of these versions': only a full gets it anywhere
    assert plan_route(ms, 3, current_digests={"w": "zz"}) is None
