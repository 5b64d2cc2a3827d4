"""Config section: Rollout workers: engine, workflow, concurrency (issue 4)."""

from __future__ import annotations

from astraflow.core.config import Section


class RolloutConfig(Section):
    """Rollout workers: engine, workflow, concurrency (issue 4)."""
