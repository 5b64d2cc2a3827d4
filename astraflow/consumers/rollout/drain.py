"""What a draining worker does with each task in flight: finish it or release it (docs/rollout.md,
"Adding and removing rollout processes while a run goes on").

A task is stale when the run's staleness filter would drop one of its policies' tokens. A stale
task is released with the tasks in flight after it on its partition, unless a later task there
has already produced its trajectories (then it is finished, so none is produced twice): per
partition the released tasks are a suffix. Pure functions, testable without a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from astraflow.consumers.rollout.context import EpisodeContext


@dataclass(frozen=True)
class InFlight:
    """One task in flight on a partition, as the drain sees it."""

    key: Hashable  # the caller's handle (the worker's asyncio task)
    offset: int
    stale: bool
    producing: bool  # its trajectories are produced or being produced


def oldest_versions(contexts: Iterable[EpisodeContext]) -> dict[str, int]:
    """Per policy, the oldest version of any token the episodes generated so far (policies
    that generated nothing yet are absent)."""
    oldest: dict[str, int] = {}
    for ctx in contexts:
        for c in ctx.conversations:
            lo = min((v for v in c.versions if v >= 0), default=None)
            if lo is not None and lo < oldest.get(c.policy, lo + 1):
                oldest[c.policy] = lo
    return oldest


def stale_by(oldest: Mapping[str, int], newest: Mapping[str, int],
             bounds: Mapping[str, int]) -> str | None:
    """The first policy (by name) whose tokens are more than its bound behind the newest
    version, or None if every one is fresh enough (a policy without a bound never is)."""
    for policy, version in sorted(oldest.items()):
        bound = bounds.get(policy)
        if bound is not None and newest.get(policy, version) - version > bound:
            return policy
    return None


def to_release(tasks: Sequence[InFlight], newest_finished: int) -> list[InFlight]:
    """Of one partition's tasks in flight, those to release now: every task from the oldest
    stale one after the last produced offset (``newest_finished``, or a task being produced)
    on; none when there is no such stale task."""
    produced = max([newest_finished, *(t.offset for t in tasks if t.producing)])
    start = min((t.offset for t in tasks if t.stale and t.offset > produced), default=None)
    if start is None:
        return []
    return [t for t in tasks if t.offset >= start]


def pick_releases(tasks: Iterable[tuple[tuple[str, int, int], InFlight]],
                  newest_finished: Callable[[tuple[str, int], int], int | None]
                  ) -> list[InFlight]:
    """Of the tasks in flight, each with its ``(topic, partition, epoch)``, those to release
    now: :func:`to_release` per partition, given ``newest_finished(tp, epoch)`` (None: the
    partition was revoked since that epoch; its tasks are released by the revoke)."""
    parts: dict[tuple[str, int, int], list[InFlight]] = {}
    for where, task in tasks:
        parts.setdefault(where, []).append(task)
    picked: list[InFlight] = []
    for (topic, partition, epoch), part in parts.items():
        produced = newest_finished((topic, partition), epoch)
        if produced is not None:
            picked += to_release(part, produced)
    return picked
