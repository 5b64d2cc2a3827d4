"""What a policy factory is given, and the reward arithmetic several policies share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from astraflow.core.records import Trajectory, unpack
from astraflow.policies.config import DataConfig

ZeroVariance = Literal["easy", "hard", "none"]


@dataclass(frozen=True)
class BuildEnv:
    """The arguments of every policy factory, ``factory(env) -> Policy``.

    ``policy`` is the policy a per-policy stage (batch) runs for; None in the shared stages.
    ``options`` are the entry's ``data.options`` (user policies).
    """

    data: DataConfig
    stage: str
    policies: tuple[str, ...] = ("default",)
    primary: str = "default"
    policy: str | None = None
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.data.batch_size_of(self.policy or self.primary)


@dataclass(frozen=True)
class RewardStats:
    n: int
    mean: float
    std: float  # population standard deviation (ddof=0)
    zero_variance: ZeroVariance


def reward_stats(rewards: Sequence[float], *, eps: float, easy_threshold: float) -> RewardStats:
    """Mean, std and the zero-variance kind of a group's rewards.

    All rewards within ``eps`` of each other → zero variance: ``easy`` when they are
    >= ``easy_threshold`` (all right), ``hard`` otherwise (all wrong). A group of one is
    zero-variance by definition; an empty one is ``none``.
    """
    n = len(rewards)
    if n == 0:
        return RewardStats(0, 0.0, 0.0, "none")
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    kind: ZeroVariance = "none"
    if max(rewards) - min(rewards) <= eps:
        kind = "easy" if mean >= easy_threshold else "hard"
    return RewardStats(n, mean, std, kind)


def token_versions(trajectories: Sequence[Trajectory]) -> tuple[int, int]:
    """(oldest, newest) policy version of any generated token; (-1, -1) if none was. A
    ``versions`` that is no whole number of int32 is refused (SchemaError), as on decode."""
    lo, hi = -1, -1
    for t in trajectories:
        v = unpack(t.versions, "<i4")
        v = v[v >= 0]
        if v.size:
            a, b = int(v.min()), int(v.max())
            lo = a if lo < 0 else min(lo, a)
            hi = max(hi, b)
    return lo, hi
