"""The cells of the benchmarks' printed tables and reports (bench/quickstart.py,
multimodel.py, agentic.py)."""

from __future__ import annotations

from typing import Any


def or_dash(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` (``.2f``, ``.0f``, …); ``-`` for None (what a run
    did not measure or reach)."""
    return "-" if value is None else format(value, spec)
