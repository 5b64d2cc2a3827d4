"""Bus lag of the run's consumer groups: how much input each stage has not yet committed."""

from __future__ import annotations

from typing import Any

from astraflow.core.bus.types import Bus
from astraflow.core.errors import BusError
from astraflow.core.topics import topic_name

#: (label, consumer group, logical topic, per policy?) — the groups the roles join.
GROUPS: list[tuple[str, str, str, bool]] = [
    ("tasks→rollout", "rollout", "tasks", False),
]


def run_lags(bus: Bus, config: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for label, group, name, per_policy in GROUPS:
        for policy in (config.policies if per_policy else [None]):
            topic = topic_name(config.run, name, policy)
            try:
                out[label + (f"[{policy}]" if policy else "")] = sum(bus.lag(group, topic).values())
            except BusError:
                continue
    return out
