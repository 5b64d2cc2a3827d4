"""What a replay runs: episodes as (decode tokens, wait seconds) segments, in task groups.

An episode is a list of :class:`Segment`: decode ``tokens`` on the engine, then wait ``wait``
seconds off it (a tool call, a verifier, the reward). A :class:`Group` is one task's episodes
(the trainer's unit); a :class:`Workload` is the groups in launch order. Workloads come from a
run directory (:mod:`astraflow.sim.recorded`) or from :func:`synthetic`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from astraflow.sim.errors import ReplayError

Z99 = 2.3263478740408408
"""The 0.99 quantile of the standard normal: a lognormal's p99/p50 is exp(sigma * Z99)."""


@dataclass(frozen=True)
class Segment:
    """Decode ``tokens`` tokens (one model turn), then wait ``wait`` seconds off the engine."""

    tokens: int
    wait: float = 0.0


@dataclass(frozen=True)
class Episode:
    """One episode's segments; ``samples``: the trajectories it yields (one per policy)."""

    segments: tuple[Segment, ...]
    samples: int = 1

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    @property
    def wait(self) -> float:
        return sum(s.wait for s in self.segments)


@dataclass(frozen=True)
class Group:
    """One task's episodes: the trainer takes whole groups."""

    id: str
    episodes: tuple[Episode, ...]

    @property
    def samples(self) -> int:
        return sum(e.samples for e in self.episodes)


@dataclass
class Workload:
    """Groups in launch order, and what the source said about the trainer and engine (None:
    unknown; the replay's options or defaults apply)."""

    groups: list[Group]
    source: str = ""
    train_s: float | None = None  # the recorded trainer's seconds per step
    batch_groups: int | None = None  # the recorded trainer's groups per step
    sec_per_token: float | None = None  # recorded generate seconds / generated tokens (median)
    notes: list[str] = field(default_factory=list)

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g.episodes]


def lognormal(rng: random.Random, p50: float, p99: float) -> float:
    """A draw from the lognormal with median ``p50`` and 0.99 quantile ``p99`` (both > 0;
    ``p99 == p50`` gives the constant ``p50``)."""
    sigma = math.log(p99 / p50) / Z99
    return p50 * math.exp(sigma * rng.gauss(0.0, 1.0)) if sigma > 0 else p50


SYNTHETIC_KEYS = {
    "p50": "median tool wait, seconds (0.05)",
    "p99": "p99 tool wait, seconds (= p50: constant)",
    "turns": "model turns per episode; a tool wait follows every turn but the last (2)",
    "tokens": "median decode tokens per turn (64)",
    "tokens_p99": "p99 decode tokens per turn (= tokens: constant)",
    "group": "episodes per group (8)",
    "groups": "groups in the workload (64)",
    "seed": "random seed (0)",
}


def parse_synthetic(spec: str) -> dict[str, float]:
    """``lognormal:p50=0.05,p99=2,turns=3`` → its settings with the defaults filled in."""
    kind, _, rest = spec.partition(":")
    if kind != "lognormal":
        raise ReplayError(f"unknown synthetic workload {kind!r} in {spec!r}; valid: lognormal "
                          f"(e.g. lognormal:p50=0.05,p99=2)")
    values = {"p50": 0.05, "turns": 2, "tokens": 64, "group": 8, "groups": 64, "seed": 0}
    problems = []
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, raw = item.partition("=")
        if key not in SYNTHETIC_KEYS or not eq:
            problems.append(f"{item!r}: expected key=value with key one of "
                            f"{', '.join(SYNTHETIC_KEYS)}")
            continue
        try:
            values[key] = float(raw)
        except ValueError:
            problems.append(f"{key}={raw!r} is not a number")
    values.setdefault("p99", values["p50"])
    values.setdefault("tokens_p99", values["tokens"])
    for key in ("p50", "p99", "tokens", "tokens_p99", "turns", "group", "groups"):
        if key in values and values[key] <= 0:
            problems.append(f"{key}={values[key]:g} must be > 0")
    for lo, hi in (("p50", "p99"), ("tokens", "tokens_p99")):
        if values[hi] < values[lo]:
            problems.append(f"{hi}={values[hi]:g} is below {lo}={values[lo]:g}")
    if problems:
        raise ReplayError(f"bad synthetic workload {spec!r}: " + "; ".join(problems))
    return values


def synthetic(spec: str) -> Workload:
    """A workload drawn from ``spec`` (see :data:`SYNTHETIC_KEYS`): every episode has
    ``turns`` turns of lognormal length (median ``tokens``, p99 ``tokens_p99``) and a
    lognormal tool wait (median ``p50``, p99 ``p99``) after every turn but the last."""
    v = parse_synthetic(spec)
    rng = random.Random(int(v["seed"]))
    turns = int(v["turns"])

    def episode() -> Episode:
        segs = []
        for i in range(turns):
            tokens = max(1, round(lognormal(rng, v["tokens"], v["tokens_p99"])))
            wait = lognormal(rng, v["p50"], v["p99"]) if i < turns - 1 else 0.0
            segs.append(Segment(tokens, wait))
        return Episode(tuple(segs))

    groups = [Group(f"g{i}", tuple(episode() for _ in range(int(v["group"]))))
              for i in range(int(v["groups"]))]
    return Workload(groups, source=f"synthetic {spec}")


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; 0.0 for none."""
    d = sorted(values)
    return d[min(len(d) - 1, max(0, math.ceil(q * len(d)) - 1))] if d else 0.0


def describe(w: Workload) -> dict[str, float | int | str]:
    """What the workload holds: counts, turns, tokens per turn and waits per episode."""
    eps = w.episodes
    turns = [s.tokens for e in eps for s in e.segments if s.tokens]
    waits = [e.wait for e in eps]
    return {
        "source": w.source, "groups": len(w.groups), "episodes": len(eps),
        "samples": sum(e.samples for e in eps),
        "turns_per_episode": len(turns) / len(eps) if eps else 0.0,
        "tokens_per_turn_p50": quantile(turns, 0.5), "tokens_per_turn_p99": quantile(turns, 0.99),
        "wait_per_episode_p50_s": quantile(waits, 0.5),
        "wait_per_episode_p99_s": quantile(waits, 0.99),
    }
