"""Bus lag of the run's consumer groups: how much input each stage has not yet committed."""

from __future__ import annotations

from typing import Any

from astraflow.core.bus.types import Bus
from astraflow.core.errors import BusError
from astraflow.core.topics import topic_name


def lag_groups(config: Any) -> list[tuple[str, str, str]]:
    """(label, consumer group, bus topic) of each group whose lag is shown: the names the roles
    themselves join (the rollout group is ``rollout.group`` when set, else the run's)."""
    return [("tasks→rollout", config.rollout.group_for(config.run),
             topic_name(config.run, "tasks"))]


def run_lags(bus: Bus, config: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for label, group, topic in lag_groups(config):
        try:
            out[label] = sum(bus.lag(group, topic).values())
        except BusError:
            continue
    return out
