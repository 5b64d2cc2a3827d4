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
