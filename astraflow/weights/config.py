"""Config section: Weight publishing and sync: codec, store, full-snapshot interval (issue 3)."""

from __future__ import annotations

from astraflow.core.config import Section


class WeightsConfig(Section):
    """Weight publishing and sync: codec, store, full-snapshot interval (issue 3)."""
