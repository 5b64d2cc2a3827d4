"""The live terminal view of a run (rich): shown by `astraflow run` and `astraflow top`.

The head line shows the trainer and the held-out accuracy; a run of several policies gets one
head line per policy (its trainer's step, version, reward and wait; its evaluation: answer
accuracy, or a verifier's balanced judgement with its right/wrong halves) and one for the
team's system accuracy."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from astraflow.run.collector import TEAM_ROLE, Collector, ComponentState

if TYPE_CHECKING:
    from rich.text import Text

# Per role: the gauges worth a column (name in the Metric, header).
ROLE_FIELDS: dict[str, list[tuple[str, str]]] = {
    "trainer": [("step", "step"), ("loss", "loss"), ("reward_mean", "reward"),
                ("wait_ratio", "wait")],
    "rollout": [("inflight", "in-flight"), ("weight_version", "weights v")],
    "evaluator": [("eval_step", "step"), ("eval_accuracy", "accuracy"),
                  ("eval_right_accuracy", "right"), ("eval_wrong_accuracy", "wrong")],
    TEAM_ROLE: [("eval_step", "solver v"), ("system_accuracy", "system"),
                ("first_accuracy", "first"), ("retry_rate", "retry")],
}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 and v != int(v) else f"{v:.0f}"
    return str(v)


def _acc(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f}"


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


def _trainer_text(c: ComponentState | None) -> str:
    if c is None:
        return ""
    g = c.metric.gauges
    return (f"step {_fmt(g.get('step'))}  version {_fmt(g.get('version'))}  "
            f"reward {_fmt(g.get('reward_mean'))}  wait {_fmt(g.get('wait_ratio'))}  ")


def _eval_text(c: ComponentState | None, label: str) -> str:
    if c is None:
        return ""
    g = c.metric.gauges
    if "eval_right_accuracy" in g:
        return (f"judgement {_acc(g.get('eval_accuracy'))} (right "
                f"{_acc(g.get('eval_right_accuracy'))} wrong {_acc(g.get('eval_wrong_accuracy'))}"
                f", v{_fmt(g.get('eval_step'))})")
    return f"{label} {_acc(g.get('eval_accuracy'))}"


def _heads(collector: Collector) -> list[Text]:
    """The head lines: one for a run of one policy (as ever), else one per policy and one
    for the team."""
    from rich.text import Text

    trainers = collector.newest_by_policy("trainer")
    evals = collector.evaluators()
    team = collector.team_evaluator()
    policies = list(dict.fromkeys([*collector.policies, *trainers, *evals]))
    if len(policies) <= 1 and team is None:
        t = next(iter(trainers.values()), None)
        e = next(iter(evals.values()), None)
        line = Text(_trainer_text(t))
        if e is not None:
            line.append(_eval_text(e, "held-out acc"), style="bold green")
        return [line] if t is not None or e is not None else []
    lines = []
    for p in policies:
        line = Text(f"{p if p is not None else '?'}: ", style="bold")
        line.append(_trainer_text(trainers.get(p)))
        e = evals.get(p)
        if e is not None:
            line.append(_eval_text(e, "held-out acc"), style="bold green")
        lines.append(line)
    if team is not None:
        g = team.metric.gauges
        versions = "  ".join(f"{k.removeprefix('version.')} v{_fmt(v)}" for k, v in g.items()
                             if k.startswith("version."))
        line = Text("team: ", style="bold")
        line.append(f"system acc {_acc(g.get('system_accuracy'))}", style="bold green")
        line.append(f"  first answer {_acc(g.get('first_accuracy'))}  retry rate "
                    f"{_acc(g.get('retry_rate'))}  ({versions or 'not evaluated yet'})")
        lines.append(line)
    return lines


def render(collector: Collector, *, lags: dict[str, int] | None = None,
           title: str = "", processes: dict[str, str] | None = None) -> Any:
    """A rich renderable of the run's state."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    eps, tps = collector.rollout_rates()
    heads = _heads(collector)
    head = Text()
    head.append(f"{title}  " if title else "", style="bold")
    if len(heads) == 1:
        head.append_text(heads[0])
        head.append("  ")
    head.append(f"rollout {eps:.1f} ep/s {tps:.0f} tok/s")
    if len(heads) > 1:
        for line in heads:
            head.append("\n  ")
            head.append_text(line)
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
    from astraflow.run.breakdown import describe, time_breakdown

    spent = time_breakdown(c.metric for c in collector.components.values())
    if spent:
        parts.append(Text("where the time goes:\n" + "\n".join(
            f"  {role}: {describe(row)}" for role, row in spent.items())))
    if processes:
        parts.append(Text("processes: " + "  ".join(f"{k}={v}" for k, v in processes.items())))
    if lags:
        parts.append(Text("bus lag: " + "  ".join(f"{k} {v}" for k, v in lags.items())))
    return Group(*parts)
