"""Config section: Data-algorithm policies: pre-rollout, post-rollout and batch stages (issue 6)."""

from __future__ import annotations

from astraflow.core.config import Section


class DataConfig(Section):
    """Data-algorithm policies: pre-rollout, post-rollout and batch stages (issue 6)."""
