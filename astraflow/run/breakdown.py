"""Where every second goes: a run's wall time per role, broken down into its phases.

Every process reports its age (``time.alive_s``) and the compute roles report where it went as
``time.<phase>_s`` counters on the ``metrics`` topic (the phases of each role: docs/metrics.md).
:func:`time_breakdown` sums them per role, a role's processes together, and names the rest
``other``. Shown by `astraflow top` and `astraflow run`'s end table, kept in ``summary.json``
under ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from astraflow.core.metrics import label
from astraflow.core.records import Metric

#: the phases in the order they are shown
PHASES = ("load", "generate", "wait", "train", "publish", "checkpoint", "evaluate")


def role_of(m: Metric) -> str:
    """The role a breakdown is kept for: the component's label (``trainer-solver``,
    ``evaluator-solver``), every rollout worker's as ``rollout``."""
    return "rollout" if m.role == "rollout" else label(m)


def time_breakdown(metrics: Iterable[Metric]) -> dict[str, dict[str, Any]]:
    """Per role (see :func:`role_of`), from the newest snapshot of each process: ``alive``
    (seconds, summed over its processes), each phase it reported, ``other`` (alive minus the
    phases, at least 0) and ``processes``. Roles that report no phase are left out."""
    out: dict[str, dict[str, Any]] = {}
    for m in metrics:
        phases = {p: m.counters[f"time.{p}_s"] for p in PHASES if f"time.{p}_s" in m.counters}
        if not phases:
            continue
        row = out.setdefault(role_of(m), {"alive": 0.0, "processes": 0})
        row["alive"] += m.counters.get("time.alive_s", 0.0)
        row["processes"] += 1
        for p, v in phases.items():
            row[p] = row.get(p, 0.0) + v
    for row in out.values():
        spent = sum(row.get(p, 0.0) for p in PHASES)
        row["other"] = max(0.0, row["alive"] - spent)
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = round(v, 1)
    return dict(sorted(out.items()))


def describe(row: dict[str, Any]) -> str:
    """One line: ``load 21s (6%)  wait 40s (12%)  train 250s (75%) … of 330s``."""
    alive = row.get("alive") or 0.0
    parts = []
    for p in (*PHASES, "other"):
        v = row.get(p)
        if v is None:
            continue
        share = f" ({100 * v / alive:.0f}%)" if alive else ""
        parts.append(f"{p} {v:.0f}s{share}")
    procs = row.get("processes", 1)
    return "  ".join(parts) + f"  of {alive:.0f}s" + (f" in {procs} processes" if procs > 1
                                                      else "")
