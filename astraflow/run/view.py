"""The live terminal view of a run (rich): shown by `astraflow run` and `astraflow top`."""

from __future__ import annotations

import time
from typing import Any

from astraflow.run.collector import Collector, ComponentState

# Per role: the gauges worth a column (name in the Metric, header).
ROLE_FIELDS: dict[str, list[tuple[str, str]]] = {
    "trainer": [("step", "step"), ("loss", "loss"), ("reward_mean", "reward"),
                ("wait_ratio", "wait")],
    "rollout": [("inflight", "in-flight"), ("weight_version", "weights v")],
    "evaluator": [("eval_step", "step"), ("eval_accuracy", "accuracy")],
}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 and v != int(v) else f"{v:.0f}"
    return str(v)


def _detail(c: ComponentState) -> str:
    m = c.metric
    fields = ROLE_FIELDS.get(m.role)
    parts = []
    if fields:
        parts = [f"{h} {_fmt(m.gauges.get(k))}" for k, h in fields if k in m.gauges]
    if m.role == "rollout":
        parts.insert(0, f"{c.rate('episodes'):.1f} ep/s")
    if not parts:  # any role: its first few counters
        parts = [f"{k} {_fmt(v)}" for k, v in list(m.counters.items())[:4]]
    return "  ".join(parts)


def render(collector: Collector, *, lags: dict[str, int] | None = None,
           title: str = "", processes: dict[str, str] | None = None) -> Any:
    """A rich renderable of the run's state."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    trainers = collector.by_role("trainer")
    evals = collector.by_role("evaluator")
    eps, tps = collector.rollout_rates()
    head = Text()
    head.append(f"{title}  " if title else "", style="bold")
    if trainers:
        g = trainers[0].metric.gauges
        head.append(f"step {_fmt(g.get('step'))}  version {_fmt(g.get('version'))}  "
                    f"reward {_fmt(g.get('reward_mean'))}  wait {_fmt(g.get('wait_ratio'))}  ")
    if evals:
        head.append(f"held-out acc {_fmt(evals[0].metric.gauges.get('eval_accuracy'))}  ",
                    style="bold green")
    head.append(f"rollout {eps:.1f} ep/s {tps:.0f} tok/s")
    table = Table(expand=True)
    for col in ("role", "component", "status", "seen", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    now = time.time()
    for c in sorted(collector.components.values(), key=lambda c: (c.metric.role, c.metric.component)):
        m = c.metric
        age = now - m.ts
        style = ("green" if m.status == "running" and age < 15 else
                 "yellow" if m.status in ("starting", "draining") or age < 60 else "red")
        table.add_row(m.role, m.component, f"[{style}]{m.status}[/]", f"{age:.0f}s ago",
                      _detail(c))
    parts: list[Any] = [head, table]
    if processes:
        parts.append(Text("processes: " + "  ".join(f"{k}={v}" for k, v in processes.items())))
    if lags:
        parts.append(Text("bus lag: " + "  ".join(f"{k} {v}" for k, v in lags.items())))
    return Group(*parts)
