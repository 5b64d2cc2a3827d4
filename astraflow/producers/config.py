"""Config section: Task producers: datasets and synthetic tasks (issue 4)."""

from __future__ import annotations

from astraflow.core.config import Section


class ProducerConfig(Section):
    """Task producers: datasets and synthetic tasks (issue 4)."""
