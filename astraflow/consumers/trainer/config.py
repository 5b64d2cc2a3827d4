"""Config section: The trainer: losses, optimizer, checkpoints (issue 5)."""

from __future__ import annotations

from astraflow.core.config import Section


class TrainerConfig(Section):
    """The trainer: losses, optimizer, checkpoints (issue 5)."""
