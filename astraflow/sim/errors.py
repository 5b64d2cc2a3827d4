"""The replay's error."""

from __future__ import annotations

from astraflow.core.errors import AstraflowError


class ReplayError(AstraflowError):
    """A workload could not be loaded or a replay option is invalid (names the path or value)."""
